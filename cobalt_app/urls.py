"""Dashboard pages (the REST API lives under /api/, the admin under /admin/)."""

from django.urls import path

from cobalt_app import views, views_compare, views_review, views_traces, views_triage

app_name = "cobalt"

urlpatterns = [
    path("", views.runs_list, name="runs"),
    path("runs/<str:run_id>/", views.run_detail, name="run"),
    path("runs/<str:run_id>/status/", views.run_status, name="run-status"),
    path("runs/<str:run_id>/items/<int:number>/", views_triage.item_panel, name="item"),
    path(
        "runs/<str:run_id>/items/<int:number>/download/<str:part>",
        views_triage.item_download,
        name="item-download",
    ),
    path("runs/<str:run_id>/export.<str:fmt>", views.run_export, name="export"),
    path("runs/<str:run_id>/review/", views_review.review, name="review"),
    path("runs/<str:run_id>/review/label/", views_review.review_label, name="review-label"),
    path("runs/<str:run_id>/review/dataset/", views_review.review_dataset, name="review-dataset"),
    path("compare/", views_compare.compare, name="compare"),
    path("compare/item/", views_compare.compare_item, name="compare-item"),
    path("trends/", views.trends, name="trends"),
    path("sweeps/", views.sweeps_list, name="sweeps"),
    path("sweeps/<str:sweep_id>/", views.sweep_detail, name="sweep"),
    path("sweeps/<str:sweep_id>/export.<str:fmt>", views.sweep_export, name="sweep-export"),
    path("traces/", views_traces.traces_list, name="traces"),
    path("traces/dataset/", views_traces.traces_to_dataset, name="traces-dataset"),
    path("traces/<str:trace_id>/", views_traces.trace_detail, name="trace"),
    path("healthz/", views.healthz, name="healthz"),
]
