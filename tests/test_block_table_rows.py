"""The model runner's block tables, kept as numpy copies that take only each step's appended entries
(ModelRunner._table_rows), equal the whole lists converted afresh (table_rows_from_lists) at every step of
engines that append, preempt, share prefix blocks, roll drafts back and split prompts."""
from __future__ import annotations

import pytest
import torch
from test_engine_equivalence import model_config

from optladder.engine.block_manager import BlockManager
from optladder.engine.config import EngineConfig, SpeculativeConfig
from optladder.engine.llm_engine import LLMEngine
from optladder.engine.model_runner import ModelRunner, table_rows_from_lists
from optladder.engine.sequence import SamplingParams, Sequence

BASE = dict(device="cpu", dtype="float32", max_model_len=512, kv_cache_gb=0.2, max_num_seqs=16, block_size=16,
            paged_kv=True, dynamic_batching=True)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def checked(monkeypatch):
    """Every _table_rows call compared with the lists converted whole; the calls counted."""
    calls = []
    real = ModelRunner._table_rows

    def table_rows(self, seqs):
        got = real(self, seqs)
        assert torch.equal(got, table_rows_from_lists(seqs)), [s.block_table for s in seqs]
        calls.append(len(seqs))
        return got
    monkeypatch.setattr(ModelRunner, "_table_rows", table_rows)
    return calls


@pytest.mark.parametrize("kw", [
    pytest.param({}, id="append"),
    pytest.param(dict(kv_cache_gb=0.0006), id="preemption"),  # ~77 blocks: sequences are preempted and readmitted
    pytest.param(dict(prefix_cache=True), id="prefix_cache"),
    pytest.param(dict(chunked_prefill=True, max_num_batched_tokens=16), id="chunked_prefill"),
    # drafts from the model's first layer: proposed every step, some rejected, their blocks rolled back
    pytest.param(dict(speculative=SpeculativeConfig("draft_layers", num_draft_tokens=3, num_draft_layers=1)),
                 id="speculative_rollback"),
])
def test_kept_tables_equal_the_lists_at_every_step(checked, kw):
    engine = LLMEngine(model_config("tiny"), EngineConfig(**{**BASE, **kw}))
    prompts = [[(7 * i + j) % 50 + 1 for j in range(20 + 9 * i)] * (2 if i % 3 == 0 else 1) for i in range(12)]
    if kw.get("prefix_cache"):
        prompts = [prompts[0][:40] + p for p in prompts]  # a shared 40-token prefix: blocks taken from the cache
    seqs = engine.generate(prompts, SamplingParams(max_tokens=40, ignore_eos=True))
    assert all(len(s) - s.num_prompt_tokens == 40 for s in seqs)
    assert len(checked) >= 10
    if "kv_cache_gb" in kw:
        assert engine.scheduler.num_preemptions > 0
    if kw.get("prefix_cache"):
        assert engine.block_manager.prefix_hits > 0
    if kw.get("speculative"):
        ev = engine.speculator.evidence()  # rejected drafts: their blocks rolled back
        assert 0 < ev["drafts_accepted"] < ev["drafts_proposed"]


def test_a_table_shrunk_in_place_or_replaced_is_copied_afresh():
    runner = ModelRunner.__new__(ModelRunner)
    runner.table_capacity = 8
    s = Sequence("r", [1, 2, 3], SamplingParams())
    s.block_table = [5, 6, 7]
    assert runner._table_rows([s]).tolist() == [[5, 6, 7]]
    s.block_table.append(9)
    assert runner._table_rows([s]).tolist() == [[5, 6, 7, 9]]
    s.block_table.pop()  # changes in place BlockManager never makes: shrunk, or the last entry replaced
    s.block_table.pop()
    assert runner._table_rows([s]).tolist() == [[5, 6]]
    s.block_table.pop()
    s.block_table.append(8)
    assert runner._table_rows([s]).tolist() == [[5, 8]]
    s.block_table = [4]  # a new list of its own (deallocate, rollback)
    assert runner._table_rows([s]).tolist() == [[4]]
    other = Sequence("q", [1], SamplingParams())
    other.block_table = list(range(20))  # wider than table_capacity: converted whole, still right
    assert runner._table_rows([s, other]).tolist() == table_rows_from_lists([s, other]).tolist()


def test_rollback_replaces_the_list():
    bm = BlockManager(num_blocks=16, block_size=4)
    s = Sequence("r", list(range(6)), SamplingParams())
    bm.allocate(s)
    s.num_computed_tokens = 6
    bm.may_append(s, 5)  # drafts' slots: positions 5..9, three blocks
    before = s.block_table
    s.num_computed_tokens = 7
    bm.rollback(s)
    assert s.block_table is not before and s.block_table == before[:2] and s.block_table_np is None
    kept = s.block_table
    bm.rollback(s)  # nothing beyond the accepted tokens: the same list, appended to later
    assert s.block_table is kept
