"""What every endpoint of the REST API shares: the error envelope (``{"detail", "code"[,
"errors"]}``), page-number pagination, the strict JSON parser, and ``JobGuardAPIView``, the base
of every view (permissions from settings, JSON only, no input that nothing reads), with the
helpers the views read their query and path through.

drf-spectacular is optional: without it ``extend_schema`` does nothing and ``AutoSchema`` is
``None`` (the API works; only the schema is missing).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.http import Http404
from django.utils.log import log_response
from rest_framework import exceptions, mixins, status
from rest_framework.pagination import PageNumberPagination
from rest_framework.parsers import JSONParser
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView
from rest_framework.views import exception_handler as drf_exception_handler

from django_jobguard import operations
from django_jobguard.api import serializers as s
from django_jobguard.api.permissions import api_permission_classes
from django_jobguard.exceptions import StoreUnavailableError

if TYPE_CHECKING:
    from drf_spectacular.openapi import AutoSchema as SpectacularSchema
    from drf_spectacular.utils import OpenApiParameter as SpectacularParameter
    from drf_spectacular.utils import OpenApiResponse as SpectacularResponse

    _ViewBase = APIView  # JobGuardAPIView is used only beside an APIView, whose methods it calls
else:
    _ViewBase = object

logger = logging.getLogger("django_jobguard.api")

AutoSchema: type[SpectacularSchema] | None
OpenApiParameter: type[SpectacularParameter] | None
OpenApiResponse: type[SpectacularResponse] | None
try:
    from drf_spectacular import openapi as _openapi
    from drf_spectacular import utils as _spectacular
except ImportError:  # the API works without drf-spectacular; only the schema is missing
    AutoSchema = OpenApiParameter = OpenApiResponse = None
else:
    OpenApiParameter = _spectacular.OpenApiParameter
    OpenApiResponse = _spectacular.OpenApiResponse

    class _Schema(_openapi.AutoSchema):
        """drf-spectacular's schema, with the ``Retry-After`` header of a store outage's 503
        (:class:`StoreUnavailable`) on every operation that documents a 503."""

        def get_override_parameters(self) -> list[Any]:
            return [*super().get_override_parameters(), _spectacular.OpenApiParameter(
                "Retry-After", int, _spectacular.OpenApiParameter.HEADER, response=[503],
                description="Seconds after which to try again (a store outage: about when "
                            "the workers try a job they put back for it again).")]

    AutoSchema = _Schema


def extend_schema(**kwargs: Any) -> Callable[[Any], Any]:
    """drf-spectacular's decorator, based on its AutoSchema even when the project's
    ``REST_FRAMEWORK['DEFAULT_SCHEMA_CLASS']`` is DRF's own (without drf-spectacular: none)."""
    schema = AutoSchema
    if schema is None:
        return lambda view: view

    def decorate(method: Any) -> Any:
        method.schema = schema
        return _spectacular.extend_schema(**kwargs)(method)

    return decorate


# -- errors ------------------------------------------------------------------------------


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "The request conflicts with the current state."
    default_code = "conflict"


class NotSupported(exceptions.APIException):
    status_code = status.HTTP_501_NOT_IMPLEMENTED
    default_detail = "The store does not support this operation."
    default_code = "not_supported"


#: The ``Retry-After`` (seconds) of a store outage's 503: about when the worker tries a job
#: it put back for the same outage again (``pipeline.STORE_OUTAGE_DELAY`` plus its jitter,
#: 2 to 5 s). No setting says how long a store stays down, so this is a hint, not a promise.
STORE_RETRY_AFTER = 5


class StoreUnavailable(exceptions.APIException):
    """A lock/throttle store could not be reached (``StoreUnavailableError``): a 503 that
    names the store, with ``Retry-After: STORE_RETRY_AFTER``; the backend's error goes to the
    log, not to the client."""

    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "A store cannot be reached; try again later."
    default_code = "store_unavailable"
    #: DRF's handler turns ``wait`` into ``Retry-After``, as for ``Throttled``'s 429.
    wait = STORE_RETRY_AFTER

    @classmethod
    def of(cls, outage: StoreUnavailableError) -> StoreUnavailable:
        return cls(f"Store {outage.store!r} cannot be reached; try again later.")


def _log_outage(outage: StoreUnavailableError, response: Response, context: dict) -> None:
    """One warning line for a store outage's 503: the request and the backend's error, not
    a server error with a traceback (the store is down, not the API). It stands for
    Django's own line for the response (``Service Unavailable: ...`` at ERROR on
    ``django.request``, which would mail the admins), so that one is not written too."""
    request = context.get("request")
    django_request = getattr(request, "_request", request)
    where = f"{request.method} {request.path}" if request is not None else "a request"
    log_response("%s answered 503: %s", where, " ".join(str(outage).split()),
                 response=response, request=django_request, logger=logger, level="warning")


def _code(exc: Exception) -> str:
    if isinstance(exc, Http404):
        return "not_found"
    if isinstance(exc, exceptions.APIException):
        codes = exc.get_codes()
        return codes if isinstance(codes, str) else exc.default_code
    return "permission_denied"


#: How many unknown fields ``detail`` names (``errors`` has them all).
UNKNOWN_IN_DETAIL = 10


def exception_handler(exc: Exception, context: dict) -> Response | None:
    """DRF's handler, reshaped so every error has ``detail`` and ``code``, and validation
    errors list their fields under ``errors``. Unknown fields keep their own code,
    ``unknown_field``, with the messages (and their "did you mean" hints) as ``detail``. A
    store that cannot be reached, from any endpoint, is a 503 ``store_unavailable``."""
    outage = exc if isinstance(exc, StoreUnavailableError) else None
    if outage is not None:
        exc = StoreUnavailable.of(outage)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if outage is not None:
        _log_outage(outage, response, context)
    if isinstance(exc, exceptions.ValidationError):
        errors = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        flat = _flatten(errors)
        if _only_unknown_fields(exc):
            response.data = {"detail": _unknown_detail(flat), "code": s.UNKNOWN_FIELD,
                             "errors": flat}
        else:
            response.data = {"detail": "Invalid input.", "code": "invalid", "errors": flat}
    else:
        detail = response.data.get("detail", "") if isinstance(response.data, dict) else ""
        response.data = {"detail": str(detail or response.status_text), "code": _code(exc)}
    return response


def _only_unknown_fields(exc: exceptions.ValidationError) -> bool:
    """Whether every error of ``exc`` is an unknown field (``StrictSerializer`` checks
    those first and alone, so they never come mixed with other errors)."""
    codes = exc.get_codes()
    return (isinstance(codes, dict) and bool(codes)
            and all(isinstance(c, list) and c and set(c) == {s.UNKNOWN_FIELD}
                    for c in codes.values()))


def _unknown_detail(errors: dict[str, list[str]]) -> str:
    """``unknown field 'dealy' (did you mean 'delay'?); unknown field 'x'``, at most
    ``UNKNOWN_IN_DETAIL`` of them, so a body of a thousand keys gets a short answer."""
    messages = [message for field_messages in errors.values() for message in field_messages]
    shown = "; ".join(messages[:UNKNOWN_IN_DETAIL])
    more = len(messages) - UNKNOWN_IN_DETAIL
    return f"{shown}; and {more} more" if more > 0 else shown


def _flatten(errors: dict) -> dict[str, list[str]]:
    """Nested serializer errors as ``{"field": ["message", ...]}`` with dotted field paths."""
    out: dict[str, list[str]] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), item)
        elif isinstance(value, list) and value and not all(isinstance(v, str) for v in value):
            for index, item in enumerate(value):
                walk(f"{prefix}.{index}", item)
        else:
            out.setdefault(prefix, []).extend(str(v) for v in (value if isinstance(value, list)
                                                               else [value]))

    walk("", errors)
    return out


def error_responses(*codes: int) -> dict[int, Any]:
    """Error responses to document; 400 is on every operation (a malformed ``Host`` header
    is refused by Django before the view runs)."""
    return {code: s.ErrorSerializer for code in sorted({400, *codes})}


READ_ERRORS = (400, 401, 403)
ONE_ERRORS = (400, 401, 403, 404)


# -- the shared base ---------------------------------------------------------------------


class Pagination(PageNumberPagination):
    """``?page=N&page_size=M`` (1 to 500, default 50); a bad ``page_size`` is a 400."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_size(self, request: Any) -> int:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        try:
            size = int(raw)
        except ValueError:
            size = 0
        if not 1 <= size <= self.max_page_size:
            raise exceptions.ValidationError({self.page_size_query_param: [
                f"A whole number from 1 to {self.max_page_size} is required."]})
        return size

    def get_page_number(self, request: Any, paginator: Any) -> Any:
        number = request.query_params.get(self.page_query_param)
        if number == "":
            raise exceptions.NotFound("Invalid page: a page number is required.")
        return super().get_page_number(request, paginator)

    def get_schema_operation_parameters(self, view: Any) -> list[dict]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"].update(minimum=1, maximum=self.max_page_size)
            if parameter["name"] == self.page_query_param:
                parameter["schema"].update(minimum=1)
        return parameters


#: How deep a request body may nest. Python's decoder gives up somewhere past ~1,000 levels
#: on 3.11/3.12 and much later on 3.13; a fixed limit makes the answer the same everywhere.
MAX_BODY_DEPTH = 200


def _too_deep(value: Any, limit: int) -> bool:
    """Whether a decoded body nests deeper than ``limit`` (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        elif not isinstance(item, list):
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in item)
    return False


class JSONBodyParser(JSONParser):
    """DRF's JSON parser, with a body nested deeper than ``MAX_BODY_DEPTH`` (or too deep for
    Python's decoder, a ``RecursionError``) refused as a 400 like any other malformed JSON."""

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            data = None
            too_deep = True
        else:
            too_deep = _too_deep(data, MAX_BODY_DEPTH)
        if too_deep:
            raise exceptions.ParseError("JSON parse error - the body is nested too deeply.",
                                        code="parse_error")
        return data


class JobGuardAPIView(_ViewBase):
    """Mixin for every endpoint: permissions from settings, JSON only, one error shape, and
    no input that nothing reads."""

    renderer_classes = [JSONRenderer]
    parser_classes = [JSONBodyParser]
    pagination_class = Pagination
    if AutoSchema is not None:
        schema = AutoSchema()
    model_permissions: dict[str, list[str]] = {}
    #: Handlers (viewset actions, or the HTTP methods of a plain view) that read a body or
    #: query parameters, each through a strict serializer. Any other request must come
    #: without them: a field sent where nothing reads it is a 400, not silently ignored.
    body_handlers: frozenset[str] = frozenset()
    query_handlers: frozenset[str] = frozenset()

    def get_permissions(self) -> list:
        return [permission() for permission in api_permission_classes()]

    def get_exception_handler(self):
        return exception_handler

    def get_authenticate_header(self, request: Any) -> str:
        """The first challenge any authentication class offers (DRF asks only the first), so
        an anonymous request gets 401 with ``WWW-Authenticate`` under DRF's default Session +
        Basic authentication, and 403 only when no configured class can challenge (``""``:
        DRF answers 403 to an empty header as to none)."""
        for authenticator in self.get_authenticators():
            header = authenticator.authenticate_header(request)
            if header:
                return header
        return ""

    def initial(self, request: Any, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        self.refuse_unread_input(request)

    def refuse_unread_input(self, request: Any) -> None:
        """400 ``unknown_field`` for query parameters or body fields sent to a handler that
        reads none (after authentication; a method with no handler stays a 405 or 404)."""
        method = request.method.lower()
        if method == "options" or getattr(self, method, None) is None:
            return
        handler = getattr(self, "action", None) or ("get" if method == "head" else method)
        if handler not in self.query_handlers:
            read_query(s.NoQuerySerializer, request)
        if method not in ("get", "head") and handler not in self.body_handlers:
            form = _form_body(request)
            if form is None:
                s.NoBodySerializer(data=request.data).is_valid(raise_exception=True)
            elif form:  # a form with fields or files where nothing reads a body
                raise exceptions.UnsupportedMediaType(request.content_type)


#: Form bodies that many HTTP clients send with a POST that has no data (Django's test client
#: an empty ``multipart/form-data``): accepted where an endpoint reads no body, if empty.
FORM_MEDIA_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")


def _form_body(request: Any) -> bool | None:
    """``None`` if the body is not a form; else whether the form has any field or file."""
    if request.content_type.partition(";")[0].strip().lower() not in FORM_MEDIA_TYPES:
        return None
    try:
        return bool(request._request.POST or request._request.FILES)
    except Exception:  # a malformed form: refused as a body that is not JSON
        return True


def read_query(serializer_class: type, request: Any) -> dict:
    """The query parameters, validated by a strict ``serializer_class`` (DRF's own allowed)."""
    serializer = serializer_class(data=request.query_params,
                                  context={"also_accepted": _drf_query_params(request)})
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def _drf_query_params(request: Any) -> list[str]:
    """Query parameters DRF reads itself: ``?format=`` and, on a list, the paginator's."""
    names = [api_settings.URL_FORMAT_OVERRIDE]
    view = (getattr(request, "parser_context", None) or {}).get("view")
    lists = (isinstance(view, mixins.ListModelMixin)
             and getattr(view, "action", "list") == "list")
    if lists and view is not None and view.paginator is not None:
        names += [view.paginator.page_query_param, view.paginator.page_size_query_param]
    return [name for name in names if name]


def request_store(request: Any):
    """The store ``?store=`` names (the default store without it); a 400 if unknown."""
    return store_named(read_query(s.StoreQuerySerializer, request).get("store"))


def store_named(alias: str | None):
    """The store called ``alias`` (the default for ``None``); a 400 if unknown."""
    try:
        return operations.store_for(alias)
    except operations.UnknownStoreError as exc:
        raise exceptions.ValidationError({"store": [str(exc)]})


def valid_key(key: str) -> str:
    """A lock or throttle key from the path, validated (a 400 if malformed)."""
    serializer = s.KeySerializer(data={"key": key})
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data["key"]


#: The parameters of an endpoint that reads ``?store=`` (and a key in its path).
STORE_PARAM: list[Any] = [s.StoreQuerySerializer]
KEY_PARAMS: list[Any] = STORE_PARAM
if OpenApiParameter is not None:
    KEY_PARAMS = [s.StoreQuerySerializer, OpenApiParameter(
        "key", str, OpenApiParameter.PATH, required=True, pattern=s.KEY_PATTERN,
        description="The lock or throttle key, e.g. jobguard:overlap:demo.jobs.Charge:7.")]
