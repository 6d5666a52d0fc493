"""RunState: the loop's typed state, and CallbackParams as a view of it (MindSpore's names)."""
import copy

import pytest
import torch

from recstream import Model
from recstream.callbacks import Callback, CallbackParams, RunContext, RunState
from recstream.callbacks.run_state import FIELDS


def test_every_view_name_is_a_run_state_attribute():
    assert set(FIELDS.values()) <= set(RunState.__slots__)


def test_params_read_and_write_the_run_state_under_mindspore_names():
    state = RunState(step=3, epoch=1)
    p = CallbackParams.view(state, network="net")
    assert (p.cur_step_num, p["cur_epoch_num"], p.get("net_outputs", "none")) == (3, 1, "none")
    p.cur_step_num = 4
    p["train_position"] = {"next": 9}
    assert (state.step, state.position) == (4, {"next": 9})
    state.outputs = torch.tensor(0.5)
    assert p.net_outputs is state.outputs and "net_outputs" in p
    assert p.network == "net" and "network" not in FIELDS  # other keys live in the dict


def test_a_field_set_to_none_is_missing_like_an_absent_key():
    p = CallbackParams(cur_step_num=0, mode="train")
    assert "metrics" not in p and p.get("metrics") is None and p.metrics is None
    with pytest.raises(KeyError):
        p["metrics"]  # noqa: B018
    p.metrics = {"auc": 0.5}
    assert p.pop("metrics") == {"auc": 0.5} and p.run_state.metrics is None
    assert p.pop("metrics", "gone") == "gone"
    del p.mode
    assert p.mode is None


def test_dict_protocol_covers_fields_and_keys():
    p = CallbackParams(cur_step_num=2, rank=0)
    assert sorted(p) == ["cur_step_num", "rank"] and len(p) == 2
    assert dict(p) == {"cur_step_num": 2, "rank": 0} == {**p} == p.copy()
    assert p == {"cur_step_num": 2, "rank": 0}
    p.update({"cur_epoch_num": 5}, online=True)
    assert p.run_state.epoch == 5 and p.run_state.online is True
    assert p.setdefault("cur_step_num", 9) == 2 and p.setdefault("x", 1) == 1
    p.clear()
    assert len(p) == 0 and p.run_state.step is None


def test_a_copy_of_params_does_not_lose_its_fields():
    p = CallbackParams(cur_step_num=7, rank=1)
    q = copy.deepcopy(p)
    assert q.cur_step_num == 7 and q.rank == 1 and q.run_state is not p.run_state


def test_run_context_hands_out_the_typed_state():
    p = CallbackParams(cur_step_num=1)
    assert RunContext(p).run_state is p.run_state
    assert RunContext({"cur_step_num": 1}).run_state is None  # a plain dict has no run state


def _model():
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 2)
    return Model(net, torch.nn.CrossEntropyLoss(), torch.optim.SGD(net.parameters(), lr=0.1),
                 metrics={"accuracy"}, progress_bar=False)


def _data(n):
    return [(torch.randn(4, 4), torch.randint(0, 2, (4,))) for _ in range(n)]


def test_the_loop_writes_the_state_callbacks_read_and_clears_the_epochs_evaluation():
    seen = []

    class Probe(Callback):
        called_in_fit_eval = False

        def on_train_begin(self, ctx):
            self.state, self.params = ctx.run_state, ctx.original_args()
            self.keys = set(dict.keys(self.params))

        def on_train_step_end(self, ctx):
            s = ctx.run_state
            assert ctx.original_args().cur_step_num == s.step and ctx.original_args().net_outputs is s.outputs
            seen.append(("step", s.epoch, s.step, s.metrics))

        def on_train_epoch_begin(self, ctx):
            seen.append(("begin", ctx.run_state.epoch, ctx.run_state.metrics))

        def on_train_epoch_end(self, ctx):
            seen.append(("end", ctx.run_state.epoch, sorted(ctx.run_state.metrics or {})))

    probe = Probe()
    _model().fit(2, _data(2), _data(1), callbacks=[probe])
    assert seen[0] == ("begin", 1, None) and seen[1][:3] == ("step", 1, 1)
    assert ("end", 1, ["accuracy"]) in seen and ("begin", 2, None) in seen  # cleared, not left over
    assert probe.state.step == 4 and probe.state.mode == "train"
    # the loop keeps its per-step state in the RunState: the dict holds only the run's objects
    assert probe.keys >= {"network", "train_network", "optimizer", "train_dataset"}
    assert not set(dict.keys(probe.params)) & set(FIELDS)
    assert set(dict.keys(probe.params)) - probe.keys == {"eval_network", "valid_dataset"}  # fit's eval
