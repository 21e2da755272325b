"""The gradient-coverage check of `gradguard fix`: an edit that removes the error together with a gradient the
optimizer uses is not a fix (NOTE [A fix must keep the gradients the optimizer uses])."""

import torch

from gradguard.backends.torch.coverage import _Recorder
from gradguard.fix.verify import RunResult, lost_gradients, merged_losses


def test_a_backward_uses_what_the_steps_before_the_next_backward_update():
    encoder, head, other = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    opt = torch.optim.SGD([*encoder.parameters(), *head.parameters()], lr=0.1)
    unused = torch.optim.SGD(other.parameters(), lr=0.1)  # noqa: F841 - an optimizer that never steps
    recorder = _Recorder("unused.json")
    loss = head(encoder(torch.randn(3, 2))).sum() + other(torch.randn(3, 2)).sum()
    recorder.backward([loss], "train.py|loss.backward()")
    recorder.step(opt)
    recorder.backward([head(torch.randn(3, 2)).sum()], None)  # reaches only the head; no step follows
    # optimizer 0's four parameters (encoder weight, bias, head weight, bias); `other` is reached but never stepped
    everything = ["0:0", "0:1", "0:2", "0:3"]
    assert recorder.used_sets() == [
        {"used": everything, "reached": everything, "stepped": everything, "site": "train.py|loss.backward()"},
        {"used": [], "reached": ["0:2", "0:3"], "stepped": [], "site": None}]


def test_a_cut_gradient_is_named_and_a_kept_one_passes():
    everything = {"0:0", "0:1", "0:2", "0:3"}
    before = RunResult(1, [], coverage=[{"used": everything, "reached": everything}, {"used": set(), "reached": set()}])
    # reached counts, not used: an edit may move the step after a later backward (backward 1 then uses nothing)
    moved = RunResult(0, [], coverage=[{"used": set(), "reached": everything}, {"used": everything,
                                                                                 "reached": {"0:2"}}])
    assert lost_gradients(before, moved) is None
    assert lost_gradients(before, RunResult(0, [], coverage=[{"used": set(), "reached": {"0:2", "0:3"}}])) == (
        "backward call 1 no longer reaches 2 of the 4 parameters that the optimizer step after it updates "
        "(optimizer 1 in the order they are made): the error goes away, but so does their gradient")
    assert lost_gradients(RunResult(1, [], coverage=None), RunResult(0, [], coverage=[])) is None


def test_one_backward_feeding_two_optimizers_is_rejected_only_where_the_original_never_did():
    critic, actor = {"1:0", "1:1"}, {"0:0", "0:1"}
    # the original: the critic's loss feeds the critic's step; the actor's backward fails before its step
    before = RunResult(1, [], coverage=[{"used": critic, "reached": critic},
                                        {"used": set(), "reached": critic | actor}])
    # the critic's step moved after the actor's backward: that backward now feeds both steps
    moved = RunResult(0, [], coverage=[{"used": set(), "reached": critic},
                                       {"used": critic | actor, "reached": critic | actor}])
    assert merged_losses(before, moved) == (
        "backward call 2 would feed the steps of optimizers 1, 2 (in the order they are made), where each of "
        "the original's losses trains one optimizer's parameters: the error goes away, but one model would also "
        "train on another's loss")
    # a fresh forward after the critic's step: each backward still feeds its own optimizer
    fresh = RunResult(0, [], coverage=[{"used": critic, "reached": critic}, {"used": actor, "reached": critic | actor}])
    assert merged_losses(before, fresh) is None
    # a program that steps an encoder's and a decoder's optimizer on one loss is left alone
    shared = RunResult(1, [], coverage=[{"used": critic | actor, "reached": critic | actor}])
    assert merged_losses(shared, moved) is None


def test_backward_calls_an_edit_reorders_are_compared_call_by_call():
    # the original (rlkit's SAC): the two critics' backwards, each with its step, then the policy's, which fails; the
    # edit moves the policy's update (backward and step) before the critics'
    qf1, qf2, policy = {"0:0", "0:1"}, {"1:0", "1:1"}, {"2:0", "2:1"}
    site = {"qf1": "sac.py|qf1_loss.backward()", "qf2": "sac.py|qf2_loss.backward()",
            "policy": "sac.py|policy_loss.backward()"}
    before = RunResult(1, [], coverage=[
        {"used": qf1, "reached": qf1, "stepped": qf1, "site": site["qf1"]},
        {"used": qf2, "reached": qf2, "stepped": qf2, "site": site["qf2"]},
        {"used": set(), "reached": qf1 | qf2 | policy, "stepped": set(), "site": site["policy"]}])
    step = [{"used": policy, "reached": qf1 | qf2 | policy, "stepped": policy, "site": site["policy"]},
            {"used": qf1, "reached": qf1, "stepped": qf1, "site": site["qf1"]},
            {"used": qf2, "reached": qf2, "stepped": qf2, "site": site["qf2"]}]
    assert lost_gradients(before, RunResult(0, [], coverage=step + step)) is None
    assert merged_losses(before, RunResult(0, [], coverage=step + step)) is None
    # compared by position, the second critic's pass would be the first's: without the sites the edit is refused
    unsited = [{k: v for k, v in entry.items() if k != "site"} for entry in step]
    assert lost_gradients(before, RunResult(0, [], coverage=unsited)) == (
        "backward call 2 no longer reaches 2 of the 2 parameters that the optimizer step after it updates "
        "(optimizer 2 in the order they are made): the error goes away, but so does their gradient")
    # an edit that drops the second critic's backward is refused by its call
    assert lost_gradients(before, RunResult(0, [], coverage=step[:2])) == (
        "backward call 2 no longer reaches 2 of the 2 parameters that the optimizer step after it updates "
        "(optimizer 2 in the order they are made): the error goes away, but so does their gradient")


def test_an_edit_that_rewrites_a_backward_line_is_compared_by_position():
    # seed 000: `rnn_loss.backward(retain_graph=True)` becomes `rnn_loss.backward()`: the original's call site is
    # gone from the edited run, so its passes are compared in order
    rnn = {"0:0", "0:1"}
    retained = "s.py|l.backward(retain_graph=True)"
    before = RunResult(1, [], coverage=[{"used": rnn, "reached": rnn, "stepped": rnn, "site": retained},
                                        {"used": set(), "reached": rnn, "stepped": set(), "site": retained}])
    after = RunResult(0, [], coverage=[{"used": rnn, "reached": rnn, "stepped": rnn, "site": "s.py|l.backward()"}] * 3)
    assert lost_gradients(before, after) is None
