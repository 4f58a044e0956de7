"""Argument search by parameter name (issue 31): ``customer_id=9`` finds the job that took
``customer_id`` by position, resolved through its class's signature, in the admin's search
boxes and the API's lists."""

from __future__ import annotations

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from django_jobguard import Job, job, operations, registry
from django_jobguard.conf import jobguard_settings
from django_jobguard.models import FinishedRun
from tests.support.inprocess import work
from tests.support.operate import API

pytestmark = pytest.mark.django_db


class NotifyCustomer(Job):
    name = "tests.argnames.NotifyCustomer"

    def __init__(self, customer_id: int, message: str = "", *, urgent: bool = False) -> None:
        self.customer_id, self.message, self.urgent = customer_id, message, urgent

    def handle(self) -> None:
        pass


class ChargeCustomer(Job):
    """Takes ``customer_id`` second: the lookup finds it at index 1 for this class."""

    name = "tests.argnames.ChargeCustomer"

    def __init__(self, amount: int, customer_id: int) -> None:
        self.amount, self.customer_id = amount, customer_id

    def handle(self) -> None:
        pass


@job(name="tests.argnames.sync_customer")
def sync_customer(customer_id: int, profile: dict | None = None) -> None:
    pass


def found(**params) -> set[str]:
    rows = operations.JobSearch.from_params(params, failed=False).queued_jobs()
    return {str(i) for i in rows.values_list("id", flat=True)}


def test_positional_index_reads_the_signature():
    assert registry.positional_index(NotifyCustomer, "customer_id") == 0
    assert registry.positional_index(NotifyCustomer, "message") == 1
    assert registry.positional_index(NotifyCustomer, "urgent") is None  # keyword-only
    assert registry.positional_index(ChargeCustomer, "customer_id") == 1
    assert registry.positional_index(sync_customer.job_class, "profile") == 1
    assert registry.positional_index(NotifyCustomer, "missing") is None


def test_a_name_finds_keyword_and_positional_arguments_of_each_class():
    by_position = NotifyCustomer(9, "hi").dispatch().id
    by_keyword = NotifyCustomer(customer_id=9).dispatch().id
    second = ChargeCustomer(9, 10).dispatch().id  # amount 9: not customer 9
    charged = ChargeCustomer(100, 9).dispatch().id
    function = sync_customer.dispatch(9).id
    ten = NotifyCustomer(10).dispatch().id
    assert found(kwargs__customer_id="9") == {by_position, by_keyword, charged, function}
    assert found(kwargs__customer_id="10") == {second, ten}
    assert found(kwargs__message='"hi"') == {by_position}
    assert found(args__0="9") == {by_position, second, function}  # positions as written


def test_deeper_lookups_reach_into_a_positional_argument():
    row = sync_customer.dispatch(1, {"plan": "gold"}).id
    sync_customer.dispatch(2, {"plan": "free"})
    assert found(kwargs__profile__plan='"gold"') == {row}


def test_the_admin_search_box_takes_a_bare_parameter_name(admin_client):
    mine = NotifyCustomer(9).dispatch().id
    NotifyCustomer(8).dispatch()
    page = admin_client.get("/admin/django_jobguard/queuedjob/", {"q": "customer_id=9"})
    assert [str(row.id) for row in page.context["cl"].result_list] == [mine]
    bad = admin_client.get("/admin/django_jobguard/queuedjob/", {"q": "customer_id=nine"})
    assert list(bad.context["cl"].result_list) == []
    assert "is not valid JSON" in bad.content.decode()


def test_history_is_searched_by_parameter_name_in_the_admin_and_the_api(admin_client,
                                                                          admin_user):
    with override_settings(JOBGUARD={**jobguard_settings.user_settings, "HISTORY": "all"}):
        mine = NotifyCustomer(9, "hello").dispatch().id
        NotifyCustomer(8).dispatch()
        work()
    assert FinishedRun.objects.count() == 2
    page = admin_client.get("/admin/django_jobguard/finishedrun/", {"q": "customer_id=9"})
    assert [str(row.job_id) for row in page.context["cl"].result_list] == [mine]
    client = APIClient()
    client.force_authenticate(admin_user)
    runs = client.get(API + "runs/", {"kwargs__customer_id": "9"}).json()["results"]
    assert [row["job_id"] for row in runs] == [mine]
    assert client.get(API + "runs/", {"kwargs__customer_id": "x"}).status_code == 400


def test_the_api_job_list_resolves_positional_arguments(admin_user):
    client = APIClient()
    client.force_authenticate(admin_user)
    mine = NotifyCustomer(9).dispatch().id
    NotifyCustomer(8).dispatch()
    listed = client.get(API + "jobs/", {"kwargs__customer_id": "9"}).json()["results"]
    assert [row["id"] for row in listed] == [mine]
