from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from cobalt_app.api import views_otlp

# The admin registers its models here, where the URLs load (the web server), not when any
# command starts Django (settings: SimpleAdminConfig): ~15 ms less for `cobalt history`.
admin.autodiscover()

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("cobalt_app.api.urls")),
    path("v1/traces", views_otlp.traces, name="otlp-traces"),  # OTLP/HTTP's standard path
    path(
        "login/",
        auth_views.LoginView.as_view(template_name="cobalt/login.html"),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("cobalt_app.urls")),
]
