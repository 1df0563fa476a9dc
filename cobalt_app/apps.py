from django.apps import AppConfig


class CobaltAppConfig(AppConfig):
    name = "cobalt_app"
    verbose_name = "Cobalt"
    default_auto_field = "django.db.models.BigAutoField"
