"""``cortex cache create --spill-to/--promote``, ``status`` of a chain, and the refusals."""

from __future__ import annotations

import kvcache
from test_cli import cortex, cortex_json, put_from_another_process


def test_create_with_spill_to_and_status_shows_the_chain_per_tier(names, tmp_path):
    low, up = names(), names()
    cortex_json("create", low, "--size", "4M", "--page-size", "4K")
    created = cortex("create", up, "--size", "256K", "--page-size", "4K", "--spill-to", low)
    assert created.returncode == 0 and f"spills to '{low}'" in created.stdout
    put_from_another_process(up, 200)
    status = cortex_json("status", up)
    assert status["spill_to"] == low and status["spills"] > 0 and status["promotions"] == 1
    (lower,) = status["chain"]
    assert lower["name"] == low and lower["num_entries"] == status["spills"] - 1
    assert lower["hits"] == 1 and lower["num_attached"] == 0
    text = cortex("status", up).stdout
    assert f"spills to            {low}" in text
    assert "PROMOTIONS" in text and low in text.splitlines()[-1]
    assert cortex_json("entries", up)["num_entries"] == status["num_entries"]


def test_promote_never_is_recorded_and_followed(names):
    low, up = names(), names()
    cortex_json("create", low, "--size", "4M", "--page-size", "4K")
    cortex_json("create", up, "--size", "256K", "--page-size", "4K", "--spill-to", low,
                "--promote", "never")  # fmt: skip
    put_from_another_process(up, 200)
    assert cortex_json("status", up)["promotions"] == 0


def test_a_disk_pool_named_as_its_own_lower_tier_is_refused(names, disk):
    name = names()
    refused = cortex(
        "create", name, "--size", "1M", "--tier", "disk", "--path", str(disk), "--spill-to", name
    )
    assert refused.returncode == 1 and "itself" in refused.stderr
    assert name not in kvcache.list_pools() and not list(disk.iterdir())


def test_a_ram_pool_spills_to_a_disk_pool_from_the_command_line(names, disk):
    low, up = names(), names()
    cortex_json("create", low, "--size", "4M", "--page-size", "4K", "--tier", "disk",
                "--path", str(disk))  # fmt: skip
    cortex_json("create", up, "--size", "256K", "--page-size", "4K", "--spill-to", low)
    put_from_another_process(up, 200)
    (lower,) = cortex_json("status", up)["chain"]
    assert lower["tier"] == "disk" and lower["num_entries"] > 0
    assert lower["path"] == str(disk / f"kvcache.{low}")


def test_refusals_are_one_line_errors_that_change_nothing(names):
    low, up = names(), names()
    missing = cortex("create", up, "--size", "1M", "--spill-to", low)
    assert missing.returncode == 1 and "create it first" in missing.stderr
    assert "Traceback" not in missing.stderr and up not in kvcache.list_pools()
    itself = cortex("create", up, "--size", "1M", "--spill-to", up)
    assert itself.returncode == 1 and "itself" in itself.stderr
    promote = cortex("create", up, "--size", "1M", "--promote", "always")
    assert promote.returncode == 2 and "invalid choice" in promote.stderr  # does not parse
    cortex_json("create", low, "--size", "4M")
    cortex_json("create", up, "--size", "1M", "--spill-to", low)
    refused = cortex("destroy", low, "--yes")
    assert refused.returncode == 1 and "spill to" in refused.stderr and "--force" in refused.stderr
    assert low in kvcache.list_pools()
    assert cortex("destroy", low, "--yes", "--force").returncode == 0
    status = cortex_json("status", up)
    assert status["chain"][0]["name"] == low and "no pool named" in status["chain"][0]["error"]
    assert "missing" in cortex("status", up).stdout
