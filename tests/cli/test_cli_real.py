"""The real-run CLI's own formatting (``jigsawrl.cli.real``)."""

from __future__ import annotations


def test_plan_note_says_what_jigsaw_ran() -> None:
    from jigsawrl.cli.real import plan_note

    fell = plan_note({"runs": "verl-queue-2", "jigsaw_s": 362.0, "verl": "verl-queue-2",
                      "verl_s": 361.0})
    assert "plan: verl-queue-2" in fell and "362 s" in fell and "verl-queue-2 361 s" in fell
    own = plan_note({"runs": "jigsaw", "jigsaw_s": None, "verl": None, "verl_s": None})
    assert "does not fit" in own and "fallback off" in own
    # the prior's forecast, not the calibrated prediction: the note says which
    assert all("first decision, on the task prior" in n for n in (fell, own))


def test_searched_note_names_the_tps_and_the_engines_per_device() -> None:
    from jigsawrl.cli.real import searched_note

    note = searched_note({"rollout_tp": {"runs": {"a": 8, "b": 8}},
                          "colocation": {"runs": 2, "predicted_s": {"1": 913.2, "2": 846.9}}})
    assert note is not None and "a 8, b 8" in note
    assert "2 rollout engine(s) per device" in note and "847 s with two, 913 s with one" in note
    assert "the config's" in (searched_note({"rollout_tp": {"runs": "configured"}}) or "")
    assert searched_note({"plan": {"runs": "jigsaw"}}) is None  # nothing searched
