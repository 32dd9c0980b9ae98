"""The plan form's module lists (recompute, offload): a link's modules reach the form's text fields in
their one spelling, and a page's memory is the plan model's for them."""

from __future__ import annotations

from parallel.core.memory import memory_per_gpu_bytes
from parallel.core.plan import Plan
from parallel.core.specs import MODELS, GiB
from tests.support.apptest import page_test

# a link typed by hand: '+' in a query string reads back as a space, which the plan accepts too
LINK = {"model": "deepseek-v3", "nodes": "2", "dp": "8", "tp": "2", "pp": "1", "sp": "1", "gb": "64"}
MODULES = {"ep": "8", "recompute": "selective", "rcm": "mla_up_proj layernorm", "offl": "attn_proj core_attn"}


def test_a_links_modules_fill_the_form_and_set_the_memory():
    at = page_test("pages/activation_memory.py", {**LINK, **MODULES})
    assert not at.exception, [e.value for e in at.exception]
    fields = {t.label: t.value for t in at.text_input}
    assert fields["rc modules"] == "layernorm+mla_up_proj" and fields["offload"] == "core_attn+attn_proj"
    plan = Plan(dp=8, tp=2, pp=1, sp=True, ep=8, global_batch=64, recompute="selective",
                recompute_modules="layernorm+mla_up_proj", offload_modules="core_attn+attn_proj")  # fmt: skip
    memory = memory_per_gpu_bytes(MODELS["deepseek-v3"], plan)["total"] / GiB
    assert [m.value for m in at.metric if m.label == "Memory per GPU"] == [f"{memory:.1f} GiB"]
