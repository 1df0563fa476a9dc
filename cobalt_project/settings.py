"""Django settings, read from the project's Cobalt configuration and `COBALT_*` variables.

Embedded default: SQLite at `<project>/.cobalt/history.db`, no broker. Team mode:
`COBALT_DATABASE_URL=postgres://…` and `COBALT_BROKER_URL=redis://…` (or the same keys in
`cobalt.toml`).
"""

from pathlib import Path

import environ

from cobalt.config import active_config
from cobalt_project.static_root import LazyRoot

env = environ.Env()
COBALT = active_config()

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent
PROJECT_DIR = COBALT.project_dir
OUTPUT_DIR = COBALT.output_dir


def _bundled(name: str) -> Path:
    """Templates and static files live at the repository root, or inside the wheel."""
    in_repo = REPO_DIR / name
    if (REPO_DIR / "pyproject.toml").is_file() and in_repo.is_dir():
        return in_repo
    return PACKAGE_DIR / name


def _secret_key() -> str:
    configured = env("COBALT_SECRET_KEY", default="")
    if configured:
        return configured
    key_file = OUTPUT_DIR / "secret_key"
    if key_file.is_file():
        return key_file.read_text().strip()
    import secrets

    key = secrets.token_urlsafe(50)
    try:
        OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
        key_file.write_text(key)
        key_file.chmod(0o600)
    except OSError:
        pass
    return key


SECRET_KEY = _secret_key()
DEBUG = env.bool("COBALT_DEBUG", default=False)
ALLOWED_HOSTS = env.list("COBALT_ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("COBALT_CSRF_TRUSTED_ORIGINS", default=[])

TEAM_MODE = COBALT.team_mode
BROKER_URL = COBALT.get("broker_url") or ""

INSTALLED_APPS = [
    "django.contrib.admin.apps.SimpleAdminConfig",  # admin.autodiscover() in urls.py
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "template_partials",
    "cobalt_app",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "cobalt_project.static_files.CollectingWhiteNoiseMiddleware",
    # Pages and API replies gzipped when asked (below WhiteNoise, which serves its own
    # precompressed files); streamed exports are compressed chunk by chunk as they stream.
    "django.middleware.gzip.GZipMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "cobalt_app.security.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "cobalt_project.urls"
WSGI_APPLICATION = "cobalt_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [_bundled("templates")],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def _database() -> dict:
    url = COBALT.get("database_url")
    if url:
        # Workers handle many small items: keep connections instead of one per task.
        database = env.db_url_config(url)
        database["CONN_MAX_AGE"] = env.int("COBALT_DB_CONN_MAX_AGE", default=300)
        database["CONN_HEALTH_CHECKS"] = True
        if "postgres" in database["ENGINE"]:
            # Each item is a few small commits; waiting for the WAL flush of every one costs
            # more than the item. A server crash may forget the last moments of commits,
            # which team mode redoes (leases and the sweeper). COBALT_DB_SYNCHRONOUS_COMMIT=on
            # restores the PostgreSQL default.
            commit = env("COBALT_DB_SYNCHRONOUS_COMMIT", default="off")
            options = database.setdefault("OPTIONS", {})
            options.setdefault("options", f"-c synchronous_commit={commit}")
        return database
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": env("COBALT_SQLITE_PATH", default=str(OUTPUT_DIR / "history.db")),
        "OPTIONS": {
            "timeout": 30,
            "transaction_mode": "IMMEDIATE",
            "init_command": (
                "PRAGMA journal_mode=WAL;PRAGMA synchronous=NORMAL;PRAGMA foreign_keys=ON;"
                "PRAGMA wal_autocheckpoint=8000;PRAGMA journal_size_limit=67108864;"
                "PRAGMA cache_size=-32000;"
            ),
        },
    }


DATABASES = {"default": _database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [_bundled("static")]
# Hashed, compressed, cached for a year; collected by the first process that serves pages
# into a cache folder per installed version (see static_files), so there is no setup step.
STATIC_ROOT = env("COBALT_STATIC_ROOT", default=None) or LazyRoot(_bundled("static"))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "cobalt_project.static_files.CollectedStaticStorage"},
}
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    # Token first: an anonymous API call gets 401 with `WWW-Authenticate: Token`.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["cobalt_app.api.permissions.CobaltAccess"],
    "EXCEPTION_HANDLER": "cobalt_app.api.views.exception_handler",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Cobalt API",
    "DESCRIPTION": "Runs, items, comparisons and trends of Cobalt experiments.",
    "VERSION": "0.1.0",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    # No deep links: Swagger UI puts each one inside its operation's button, a link in a
    # button (axe: nested-interactive). Page and contrast: templates/drf_spectacular/.
    "SWAGGER_UI_SETTINGS": {"deepLinking": False},
    "REDOC_DIST": "SIDECAR",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "cobalt_app.api.views.document_server_limits",
    ],
    "SERVE_PERMISSIONS": ["cobalt_app.api.permissions.CobaltAccess"],
    "SERVE_AUTHENTICATION": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": "cobalt_app.models.Run.Status",
        "ItemStatusEnum": "cobalt_app.models.ItemResult.Status",
        "LabelVerdictEnum": "cobalt_app.models.Label.Verdict",
    },
}

CELERY_BROKER_URL = BROKER_URL or "memory://"
if BROKER_URL.startswith("redis://"):  # one Redis client per channel (cobalt_app/broker.py)
    CELERY_BROKER_TRANSPORT = "cobalt_app.broker:Transport"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "cobalt"
CELERY_TASK_IGNORE_RESULT = True
CELERY_WORKER_DISABLE_RATE_LIMITS = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
# Redis hands a message that was not acknowledged within this many seconds to another worker.
# A lane (cobalt_app.worker_runtime) therefore works for at most a third of it, then hands
# its continuation to the queue as a new message.
VISIBILITY_TIMEOUT = env.float("COBALT_VISIBILITY_TIMEOUT", default=3600.0)
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": VISIBILITY_TIMEOUT}

DEFAULT_EXCEPTION_REPORTER_FILTER = "cobalt_app.security.RedactingExceptionReporterFilter"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "filters": {"redact": {"()": "cobalt_app.log_redaction.RedactingFilter"}},
    "handlers": {
        "stderr": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["redact"]}
    },
    "loggers": {
        "cobalt": {"handlers": ["stderr"], "level": env("COBALT_LOG_LEVEL", default="WARNING")},
    },
}
