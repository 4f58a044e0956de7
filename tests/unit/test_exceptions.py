"""django_jobguard.exceptions: jobguard's exceptions, and the one place a job's exception is
written down (the log line, the row's ``last_error``, a failed job's and a kept result's class
path and traceback, a stored error shortened for a failure's reason).

Where the text ends up is covered elsewhere: ``last_error`` on a released row
(tests/unit/test_queue.py), a failure's reason naming the last error
(tests/unit/test_failure_reasons.py), a kept result's errors (tests/unit/test_results.py).
"""

from __future__ import annotations

from django_jobguard.exceptions import (
    StoreUnavailableError,
    class_path,
    describe,
    error_text,
    short_error,
    traceback_text,
)


class ServiceDown(Exception):
    """What a job raises in these tests."""


def _raised(exception: BaseException) -> BaseException:
    try:
        raise exception
    except BaseException as caught:
        return caught


def test_class_path_is_the_module_and_qualified_name():
    assert class_path(ValueError("bad")) == "builtins.ValueError"
    assert class_path(ServiceDown()) == f"{__name__}.ServiceDown"
    assert class_path(StoreUnavailableError("redis", "down")) == (
        "django_jobguard.exceptions.StoreUnavailableError")


def test_describe_is_one_line_with_the_exceptions_full_name():
    assert describe(ValueError("bad")) == "builtins.ValueError: bad"
    assert describe(ServiceDown("503")) == f"{__name__}.ServiceDown: 503"
    assert len(describe(ValueError("x" * 5000))) == 2000


def test_error_text_is_the_description_then_the_traceback():
    def send_sms():
        raise ServiceDown("Twilio: 503")

    try:
        send_sms()
    except ServiceDown as error:
        text = error_text(error)
    line, traceback = text.split("\n\n", 1)
    assert line == f"{__name__}.ServiceDown: Twilio: 503"
    assert traceback.startswith("Traceback (most recent call last)")
    assert "in send_sms" in traceback
    assert traceback.rstrip().endswith("ServiceDown: Twilio: 503")


def test_error_text_keeps_the_end_of_a_very_long_traceback():
    error = _raised(ServiceDown("x" * 30_000 + "THE END"))
    text = error_text(error)
    assert len(text) == 2000 + 2 + 20_000
    assert text.rstrip().endswith("THE END")


def test_error_text_of_an_exception_that_was_never_raised():
    assert error_text(ValueError("bad")) == "builtins.ValueError: bad\n\nValueError: bad\n"


def test_traceback_text_keeps_the_end_up_to_its_limit():
    error = _raised(ServiceDown("x" * 60_000 + "THE END"))
    assert len(traceback_text(error)) == 50_000
    assert traceback_text(error).rstrip().endswith("THE END")
    assert traceback_text(error, 100).rstrip().endswith("THE END")
    assert len(traceback_text(error, 100)) == 100
    assert traceback_text(ValueError("bad")) == "ValueError: bad\n"


def test_short_error_is_the_class_name_and_message_of_a_stored_error():
    stored = error_text(_raised(ServiceDown("Twilio: 503")))
    assert short_error(stored) == "ServiceDown: Twilio: 503"
    assert short_error("builtins.ValueError: bad") == "ValueError: bad"
    assert short_error("something without a class") == "something without a class"
    assert short_error("first line\nsecond: line") == "first line"
