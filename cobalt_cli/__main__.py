from cobalt_cli.main import main

main()
