from django.contrib import admin

from cobalt_app.models import Evaluation, ItemResult, JudgeCacheEntry, Run, RunTag


class RunTagInline(admin.TabularInline):
    model = RunTag
    extra = 0


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "status", "mode", "created_at", "total_items", "error_count"]
    list_filter = ["status", "mode", "name"]
    search_fields = ["id", "name"]
    date_hierarchy = "created_at"
    readonly_fields = ["id", "created_at"]
    inlines = [RunTagInline]


class EvaluationInline(admin.TabularInline):
    model = Evaluation
    extra = 0
    fields = ["evaluator", "score", "status", "reason", "error", "cached"]
    readonly_fields = fields


@admin.register(ItemResult)
class ItemResultAdmin(admin.ModelAdmin):
    list_display = ["id", "run", "item_index", "run_index", "item_key", "status", "latency_ms"]
    list_filter = ["status"]
    search_fields = ["run__id", "item_key"]
    raw_id_fields = ["run"]
    list_select_related = ["run"]
    inlines = [EvaluationInline]


@admin.register(Evaluation)
class EvaluationAdmin(admin.ModelAdmin):
    list_display = ["id", "run", "evaluator", "score", "status", "cached"]
    list_filter = ["status", "evaluator", "cached"]
    raw_id_fields = ["item", "run"]


@admin.register(JudgeCacheEntry)
class JudgeCacheEntryAdmin(admin.ModelAdmin):
    list_display = ["key", "provider", "model", "created_at", "expires_at"]
    list_filter = ["provider", "model"]
