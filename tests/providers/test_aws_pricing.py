"""The local AWS pricing APIs through boto3: the Price List API's GetProducts and EC2's
DescribeSpotPriceHistory, serving the bundled catalog as the market moves it."""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal

import boto3
import pytest
from botocore.exceptions import ClientError

from broker.clock import ManualClock
from pricing.aws_catalog import load_aws_csv
from providers.local import LocalCloud

ON_DEMAND_LINUX = [
    {"Type": "TERM_MATCH", "Field": field, "Value": value}
    for field, value in {
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
    }.items()
]


def client(cloud: LocalCloud, service: str, region: str = "us-east-1"):  # type: ignore[no-untyped-def]
    return boto3.client(
        service,
        region_name=region,
        endpoint_url=cloud.aws_endpoint_url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def by_type(instance_type: str, region: str | None = None) -> list[dict[str, str]]:
    filters = [{"Type": "TERM_MATCH", "Field": "instanceType", "Value": instance_type}]
    if region:
        filters.append({"Type": "TERM_MATCH", "Field": "regionCode", "Value": region})
    return filters + ON_DEMAND_LINUX


def hourly_usd(item: str) -> Decimal:
    terms = json.loads(item)["terms"]["OnDemand"]
    (term,) = terms.values()
    (dimension,) = term["priceDimensions"].values()
    assert dimension["unit"] == "Hrs"
    return Decimal(dimension["pricePerUnit"]["USD"])


def test_get_products_answers_the_catalog_price_as_a_price_list_json_string(
    local_cloud: LocalCloud,
) -> None:
    pricing = client(local_cloud, "pricing")
    answer = pricing.get_products(
        ServiceCode="AmazonEC2", Filters=by_type("p3.2xlarge", "us-east-1"), FormatVersion="aws_v1"
    )
    assert answer["FormatVersion"] == "aws_v1"
    (item,) = answer["PriceList"]
    assert isinstance(item, str)  # the API returns JSON documents as strings
    product = json.loads(item)["product"]
    assert product["productFamily"] == "Compute Instance"
    attributes = product["attributes"]
    assert (attributes["instanceType"], attributes["regionCode"]) == ("p3.2xlarge", "us-east-1")
    assert attributes["marketoption"] == "OnDemand"
    assert hourly_usd(item) == Decimal("3.06")  # AWS's list price, as CATALOG.md records it
    assert "NextToken" not in answer


def test_get_products_filters_match_every_filter_and_every_filter_type(
    local_cloud: LocalCloud,
) -> None:
    pricing = client(local_cloud, "pricing")

    def products(*filters: dict[str, str]) -> list[dict]:
        pages = pricing.get_paginator("get_products").paginate(
            ServiceCode="AmazonEC2", Filters=list(filters)
        )
        return [json.loads(item)["product"]["attributes"] for p in pages for item in p["PriceList"]]

    catalog = load_aws_csv()
    regions = set(catalog.region[catalog.instance_type == "g5.xlarge"].tolist())
    g5 = products({"Type": "TERM_MATCH", "Field": "instanceType", "Value": "g5.xlarge"})
    assert {p["regionCode"] for p in g5} == regions and len(g5) == len(regions)
    assert not products(
        *by_type("g5.xlarge"),
        {"Type": "TERM_MATCH", "Field": "operatingSystem", "Value": "Windows"},
    )
    any_of = products(
        {"Type": "ANY_OF", "Field": "instanceType", "Value": "g5.xlarge, p3.2xlarge"},
        {"Type": "EQUALS", "Field": "regionCode", "Value": "us-east-1"},
    )
    assert sorted(p["instanceType"] for p in any_of) == ["g5.xlarge", "p3.2xlarge"]
    contains = products(
        {"Type": "CONTAINS", "Field": "instanceType", "Value": "p3."},
        {"Type": "NONE_OF", "Field": "regionCode", "Value": ",".join(sorted(regions - {"x"}))},
    )
    assert contains and all(p["instanceType"].startswith("p3.") for p in contains)
    assert all(p["regionCode"] not in regions for p in contains)
    assert not products({"Type": "TERM_MATCH", "Field": "noSuchAttribute", "Value": "x"})


def test_get_products_pages_with_next_token_and_rejects_a_foreign_token(
    local_cloud: LocalCloud,
) -> None:
    pricing = client(local_cloud, "pricing")
    filters = [{"Type": "CONTAINS", "Field": "instanceType", "Value": "g4dn."}]
    first = pricing.get_products(ServiceCode="AmazonEC2", Filters=filters, MaxResults=7)
    assert len(first["PriceList"]) == 7 and first["NextToken"]
    seen = [json.loads(i)["product"]["sku"] for i in first["PriceList"]]
    token = first["NextToken"]
    while token:
        page = pricing.get_products(
            ServiceCode="AmazonEC2", Filters=filters, MaxResults=7, NextToken=token
        )
        seen += [json.loads(i)["product"]["sku"] for i in page["PriceList"]]
        token = page.get("NextToken")
    every = [
        json.loads(i)["product"]["sku"]
        for p in pricing.get_paginator("get_products").paginate(
            ServiceCode="AmazonEC2", Filters=filters
        )
        for i in p["PriceList"]
    ]
    assert seen == every and len(set(every)) == len(every) > 7
    with pytest.raises(ClientError) as error:
        pricing.get_products(
            ServiceCode="AmazonEC2", Filters=by_type("p3.2xlarge"), NextToken=first["NextToken"]
        )
    assert error.value.response["Error"]["Code"] == "InvalidNextTokenException"


def test_get_products_follows_a_market_change_of_the_regional_on_demand_price(
    local_cloud: LocalCloud,
) -> None:
    pricing = client(local_cloud, "pricing")
    local_cloud.market.set_price("aws", "use1-az6", "p3.2xlarge", "on_demand", 2_500_000)
    (item,) = pricing.get_products(
        ServiceCode="AmazonEC2", Filters=by_type("p3.2xlarge", "us-east-1")
    )["PriceList"]
    assert hourly_usd(item) == Decimal("2.5")
    local_cloud.market.set_price("aws", "us-east-1c", "p3.2xlarge", "on_demand", -1)
    answer = pricing.get_products(
        ServiceCode="AmazonEC2", Filters=by_type("p3.2xlarge", "us-east-1")
    )
    assert answer["PriceList"] == []  # withdrawn


def spot_prices(cloud: LocalCloud, **request: object) -> list[dict]:
    ec2 = client(cloud, "ec2")
    pages = ec2.get_paginator("describe_spot_price_history").paginate(**request)
    return [item for page in pages for item in page["SpotPriceHistory"]]


def test_spot_history_serves_the_catalog_spot_price_per_zone(local_cloud: LocalCloud) -> None:
    items = spot_prices(
        local_cloud, InstanceTypes=["p3.2xlarge"], ProductDescriptions=["Linux/UNIX"]
    )
    catalog = load_aws_csv()
    rows = (catalog.instance_type == "p3.2xlarge") & (catalog.region == "us-east-1")
    expected = {
        zone: Decimal(int(price)) / 1_000_000
        for zone, price in zip(catalog.zone[rows], catalog.spot_micros_per_hour[rows], strict=True)
        if price >= 0
    }
    assert {i["AvailabilityZoneId"]: Decimal(i["SpotPrice"]) for i in items} == expected
    assert {i["InstanceType"] for i in items} == {"p3.2xlarge"}
    assert all(i["ProductDescription"] == "Linux/UNIX" for i in items)
    assert all(i["AvailabilityZone"].startswith("us-east-1") for i in items)
    assert not spot_prices(
        local_cloud, InstanceTypes=["p3.2xlarge"], ProductDescriptions=["Windows"]
    )
    one_zone = spot_prices(local_cloud, InstanceTypes=["p3.2xlarge"], AvailabilityZone="us-east-1a")
    assert {i["AvailabilityZone"] for i in one_zone} == {"us-east-1a"}


def test_spot_history_shows_set_and_staged_prices_once_the_clock_passes(
    local_cloud: LocalCloud, market_clock: ManualClock
) -> None:
    market = local_cloud.market
    wanted = {"InstanceTypes": ["p3.2xlarge"], "AvailabilityZone": "us-east-1a"}
    (base,) = spot_prices(local_cloud, **wanted)
    market_clock.advance(60)
    market.set_price("aws", "use1-az6", "p3.2xlarge", "spot", 777_000)
    set_at = market_clock.now()
    market.stage_price(
        set_at + timedelta(minutes=10), "aws", "us-east-1a", "p3.2xlarge", "spot", 888_000
    )

    history = spot_prices(local_cloud, **wanted)
    assert [(i["SpotPrice"], i["Timestamp"]) for i in history] == [
        ("0.777000", set_at),
        (base["SpotPrice"], base["Timestamp"]),
    ]
    market_clock.advance(600)
    newest = spot_prices(local_cloud, **wanted)[0]
    assert (newest["SpotPrice"], newest["Timestamp"]) == (
        "0.888000",
        set_at + timedelta(minutes=10),
    )
    # From StartTime on: the price in effect then, and the newer ones.
    since = spot_prices(local_cloud, StartTime=set_at + timedelta(minutes=1), **wanted)
    assert [i["SpotPrice"] for i in since] == ["0.888000", "0.777000"]
