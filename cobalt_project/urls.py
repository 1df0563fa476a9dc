from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("cobalt_app.api.urls")),
    path("", include("cobalt_app.urls")),
]
