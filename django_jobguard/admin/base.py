"""What the admin's pages share: list columns (timestamps to the second, dotted names that
wrap, stored errors and payloads), the job lists' search box and bulk confirmation page,
read-only detail pages, and the job name filter."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.paginator import Paginator
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.functional import Promise, cached_property
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.translation import gettext_lazy as _

from django_jobguard import operations, registry
from django_jobguard import tags as job_tags
from django_jobguard.models import may_view_arguments
from django_jobguard.operations import monitoring

if TYPE_CHECKING:  # the mixins are used only beside ModelAdmin, whose methods they call
    _AdminBase = admin.ModelAdmin
else:
    _AdminBase = object

#: A label: a string or a lazy translation.
Label = str | Promise


def pretty_error(text: str) -> str:
    """A stored error: its ``Class: message`` line and traceback, as preformatted text."""
    return format_html('<pre class="jobguard-traceback">{}</pre>', text) if text else "-"


def pretty_json(value: Any) -> str:
    """A JSON value (a payload), indented, as preformatted text."""
    return format_html('<pre class="jobguard-json">{}</pre>',
                       json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))


def pretty_context(payload: Any) -> str:
    """The context a job was dispatched in (what the carriers captured: language, correlation
    id, tenant...), one ``name: value`` line each; "-" when it carries none."""
    context = payload.get("context") if isinstance(payload, dict) else None
    if not isinstance(context, dict) or not context:
        return "-"
    lines = (f"{name}: {value if isinstance(value, str) else json.dumps(value)}"
             for name, value in sorted(context.items()))
    return format_html('<pre class="jobguard-context">{}</pre>', "\n".join(lines))


def timestamp_column(field: str, label: Any) -> Any:
    """A list column showing ``field`` to the second, in the current time zone (Django's
    default format leaves seconds out, and jobs move by the second)."""

    @admin.display(description=label, ordering=field)
    def column(self: Any, obj: Any) -> str:
        value = getattr(obj, field)
        return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S") if value else "-"

    return column


def breakable(name: str) -> str:
    """A dotted name that may wrap after each dot (long job paths in a narrow column)."""
    return format_html_join(mark_safe(".<wbr>"), "{}", ((part,) for part in name.split(".")))


#: Rows named on a confirmation page (the count covers them all).
CONFIRM_SAMPLE = 10

#: The search box also takes argument lookups: ``kwargs__invoice_id=7 args__0="abc"``.
_SEARCH_TOKEN = re.compile(r'(?:[^\s"]+|"(?:\\.|[^"\\])*")+')


#: Characters of the arguments a list row shows (the whole text is the cell's tooltip).
PREVIEW_CHARS = 40


def arguments_text(payload: Any) -> str:
    """A payload's arguments as a call's: ``9, 'x', notify=True`` (``""`` for none)."""
    payload = payload if isinstance(payload, dict) else {}
    args, kwargs = payload.get("args", []), payload.get("kwargs") or {}
    shown = [_short_json(a) for a in (args if isinstance(args, list) else [args])]
    if isinstance(kwargs, dict):
        shown += [f"{key}={_short_json(value)}" for key, value in kwargs.items()]
    return ", ".join(shown)


def _short_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def arguments_preview(payload: Any) -> str:
    """The arguments column of a job list: the first :data:`PREVIEW_CHARS` characters, the
    whole text as the tooltip."""
    text = arguments_text(payload)
    if not text:
        return "-"
    short = text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS - 1] + "…"
    return format_html('<code class="jobguard-args" title="{}">{}</code>', text, short)


def split_search(term: str) -> tuple[list[tuple[str, str]], str]:
    """``(argument lookups, the rest of the search)`` from the search box's text. A bare
    parameter name (``customer_id=9``) is a ``kwargs__`` lookup, which also finds the
    argument passed by position (:func:`~django_jobguard.operations.search.filter_arguments`)."""
    lookups, rest = [], []
    for token in _SEARCH_TOKEN.findall(term or ""):
        name, sep, value = token.partition("=")
        if sep and operations.search.is_argument_param(name):
            lookups.append((name, value))
        elif sep and name.isidentifier() and name not in operations.search.ARGUMENT_ROOTS:
            lookups.append((f"kwargs__{name}", value))
        else:
            rest.append(token)
    return lookups, " ".join(rest)


class EstimatedCountPaginator(Paginator):
    """A list paginator whose count is exact up to
    :data:`~django_jobguard.operations.monitoring.EXACT_UP_TO` rows (a LIMITed count), above
    it PostgreSQL's planner estimate (``estimated``: the list says "about N"), so a page of a
    million-row list costs no COUNT(*) over the table. Other databases count exactly
    (:func:`~django_jobguard.operations.monitoring.count_or_estimate`)."""

    estimated = False
    exact_up_to = monitoring.EXACT_UP_TO

    @cached_property
    def count(self) -> int:
        rows = self.object_list
        if not hasattr(rows, "query"):  # not a queryset: a list
            return len(rows)
        count, self.estimated = monitoring.count_or_estimate(rows, exact_up_to=self.exact_up_to)
        return count


class HideArgumentsMixin(_AdminBase):
    """Arguments only for users with ``view_job_arguments`` (payloads may hold personal
    data): for the others the list columns ``argument_columns``, the detail fields
    ``argument_fields`` and the search fields ``argument_search_fields`` are left out."""

    argument_columns: tuple[str, ...] = ()
    argument_fields: tuple[str, ...] = ()
    argument_search_fields: tuple[str, ...] = ()

    def get_list_display(self, request: HttpRequest) -> Any:
        shown = super().get_list_display(request)
        if may_view_arguments(request.user):
            return shown
        return [column for column in shown if column not in self.argument_columns]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = super().get_fields(request, obj)
        if may_view_arguments(request.user):
            return fields
        return [field for field in fields if field not in self.argument_fields]

    def get_search_fields(self, request: HttpRequest) -> Any:
        fields = super().get_search_fields(request)
        if may_view_arguments(request.user):
            return fields
        return [field for field in fields if field not in self.argument_search_fields]


class ArgumentSearchMixin(HideArgumentsMixin):
    """A list whose search box takes argument lookups (``kwargs__invoice_id=7``,
    ``customer_id=9``, ``args__0="abc"``) beside the usual text search: the JSON of the
    arguments is in ``arguments_field`` (a queued or failed job's payload, a run's
    arguments). Users without ``view_job_arguments`` cannot search by arguments."""

    arguments_field = "payload"

    def get_search_results(self, request: HttpRequest, queryset: Any, search_term: str):
        lookups, rest = split_search(search_term)
        if lookups and not may_view_arguments(request.user):
            self.message_user(request, _("Search: searching by arguments needs the permission "
                                         "to view job arguments."), messages.ERROR)
            return queryset.none(), False
        if lookups:
            try:
                queryset = operations.search.filter_arguments(
                    queryset, operations.search.parse_arguments(lookups),
                    field=self.arguments_field)
            except operations.SearchError as exc:
                if not getattr(request, "_jobguard_search_error", False):
                    setattr(request, "_jobguard_search_error", True)  # noqa: B010
                    self.message_user(request, _("Search: %(error)s") % {"error": exc.message},
                                      messages.ERROR)
                return queryset.none(), False
        narrowed = queryset  # the list's filters (and argument lookups) applied
        queryset, duplicates = super().get_search_results(request, queryset, rest)
        if rest:
            queryset = self.also_found(queryset, narrowed, rest)
        return queryset, duplicates

    def also_found(self, found: Any, narrowed: Any, text: str) -> Any:
        """``found`` (the text search's rows) with the rows of ``narrowed`` that ``text``
        finds beyond ``search_fields``: none here."""
        return found


class TagFilter(admin.SimpleListFilter):
    """Rows carrying a tag (``?tag=billing``): the tags of the first rows found are offered."""

    title = _("tag")
    parameter_name = "tag"

    def lookups(self, request, model_admin):
        rows = model_admin.model._default_manager.using(model_admin.get_queryset(request).db)
        texts = rows.exclude(tags="").values_list("tags", flat=True).distinct().order_by()[:200]
        return [(tag, tag) for tag in sorted({tag for text in texts
                                              for tag in job_tags.decode(text)})]

    def queryset(self, request, queryset):
        value = self.value()
        if value:
            return queryset.filter(job_tags.lookup(value))
        return queryset


@admin.display(description=_("tags"))
def tags_display(model_admin: Any, obj: Any) -> str:
    """A row's tags for a list or a detail page (``-`` for none): a ModelAdmin method
    (``tags_display = tags_display`` in the class)."""
    found = job_tags.decode(obj.tags)
    if not found:
        return "-"
    return format_html_join(" ", '<code class="jobguard-tag">{}</code>', ((t,) for t in found))


class JobSearchAdminMixin(ArgumentSearchMixin):
    """The queued and failed job lists: names shown (and filtered) as operators know them
    (a django.tasks task's own name), the search box taking argument lookups, and bulk
    actions over everything the list matches, confirmed with a count first."""

    search_help_text = _('Ids, names, or arguments as JSON by parameter name: customer_id=9 '
                         'kwargs__invoice_id=7 args__0="abc"')
    argument_columns = ("arguments_display",)
    argument_fields = ("payload_pretty", "context_pretty")

    class Media:
        css = {"all": ["django_jobguard/admin-lists.css"]}

    @admin.display(description=_("job name"), ordering="name")
    def name_display(self, obj: Any) -> str:
        return breakable(registry.display_name(obj.name, obj.payload))

    # "args", not "arguments": the queued list fits 1280 px with it (tests/integration).
    @admin.display(description=_("args"))
    def arguments_display(self, obj: Any) -> str:
        return arguments_preview(obj.payload)

    def also_found(self, found: Any, narrowed: Any, text: str) -> Any:
        """The names operators see: a django.tasks task's own dotted name."""
        for adapter, keys in registry.display_paths().items():
            found |= narrowed.filter(name=adapter, **{
                "payload__" + "__".join(keys) + "__icontains": text})
        return found

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None):
        queue = request.GET.get("queue")
        if queue and request.method == "GET":  # a typo must not look like an empty queue
            try:
                operations.search.check_queue(queue)
            except operations.SearchError as exc:
                self.message_user(request, exc.message, messages.WARNING)
        return super().changelist_view(request, extra_context)

    def confirm(self, request: HttpRequest, queryset: Any, *, title: Label, question: Label,
                button: Label, notes: list[str] | None = None,
                count: int | None = None) -> TemplateResponse | None:
        """The confirmation page of a bulk action (None once it was confirmed): how many
        jobs, the search, and the first few of them. With "select all", ``queryset`` is
        everything the list matches; nothing is loaded but the count and the sample."""
        if request.POST.get("post") == "yes":
            return None
        if count is None:
            count = queryset.count()
        sample = [f"{registry.display_name(row.name, row.payload)} [{row.id}]"
                  for row in queryset.order_by("id")[:CONFIRM_SAMPLE]]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts, "title": title, "question": question, "button": button,
            "notes": notes or [], "count": count, "sample": sample,
            "search": request.GET.get("q", "") or "",
            "action": request.POST.get("action", ""),
            "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across") in ("1", "True", "true"),
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/django_jobguard/bulk_confirmation.html",
                                context)


class ReadOnlyDetailMixin(_AdminBase):
    """Rows are written by workers, not by hand: no add form, detail pages are read-only
    (object-level change permission is off), while list actions still need change."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None:
            return False
        return super().has_change_permission(request, obj)


class JobNameFilter(admin.SimpleListFilter):
    """Job names as operators know them: a django.tasks task by its own dotted name."""

    title = _("job name")
    parameter_name = "name"
    result = False

    def lookups(self, request, model_admin):
        rows = model_admin.model._default_manager.using(model_admin.get_queryset(request).db)
        paths = registry.display_paths(result=self.result)
        names = set(rows.exclude(name__in=list(paths)).values_list("name", flat=True)
                    .distinct().order_by())
        for adapter, keys in paths.items():
            names.update(value for value in rows.filter(name=adapter).values_list(
                "payload__" + "__".join(keys), flat=True).distinct().order_by()
                if isinstance(value, str))
        return [(name, name) for name in sorted(names)]

    def queryset(self, request, queryset):
        value = self.value()
        if value:
            return queryset.filter(operations.name_q(value, result=self.result))
        return queryset
