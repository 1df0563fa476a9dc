"""`/api/…` routes, the OpenAPI schema and its Swagger UI (served from local static files)."""

from django.urls import path, re_path

from cobalt_app.api import views, views_item, views_judges, views_sweeps

urlpatterns = [
    path("runs/", views.RunListView.as_view(), name="api-run-list"),
    path("runs/<str:run_id>/", views.RunDetailView.as_view(), name="api-run-detail"),
    path("runs/<str:run_id>/items/", views.RunItemsView.as_view(), name="api-run-items"),
    path(
        "runs/<str:run_id>/items/<int:number>/",
        views_item.ItemDetailView.as_view(),
        name="api-run-item",
    ),
    path("runs/<str:run_id>/cancel/", views.RunCancelView.as_view(), name="api-run-cancel"),
    path("runs/<str:run_id>/labels/", views.RunLabelsView.as_view(), name="api-run-labels"),
    path(
        "runs/<str:run_id>/items/<int:number>/labels/",
        views.ItemLabelsView.as_view(),
        name="api-item-labels",
    ),
    path(
        "runs/<str:run_id>/items/<int:number>/add-to-dataset/",
        views.AddToDatasetView.as_view(),
        name="api-item-add-to-dataset",
    ),
    path("compare/", views.CompareView.as_view(), name="api-compare"),
    path("compare/pairwise/", views_judges.PairwiseCompareView.as_view(), name="api-pairwise"),
    path(
        "judges/<str:judge>/calibration/",
        views_judges.JudgeCalibrationView.as_view(),
        name="api-judge-calibration",
    ),
    path("trends/", views.TrendsView.as_view(), name="api-trends"),
    path("sweeps/", views_sweeps.SweepListView.as_view(), name="api-sweep-list"),
    path("sweeps/<str:sweep_id>/", views_sweeps.SweepDetailView.as_view(), name="api-sweep-detail"),
    path("experiments/", views.ExperimentsView.as_view(), name="api-experiments"),
    path("config/", views.ConfigView.as_view(), name="api-config"),
    path("schema/", views.SchemaView.as_view(), name="api-schema"),
    path("docs/", views.DocsView.as_view(url_name="api-schema"), name="api-docs"),
    # Last: unknown endpoints answer in JSON too, for any method (a GET of an endpoint
    # without its slash is redirected).
    re_path(r"^[\s\S]*$", views.endpoint_not_found, name=views.NOT_FOUND),  # newlines too
]
