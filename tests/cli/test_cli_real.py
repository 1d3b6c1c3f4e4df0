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


def test_searched_note_says_when_a_verl_placement_runs_instead_of_the_co_located_plan() -> None:
    """The memory-tight 32B pair: two engines chosen for jigsaw's own plan, then its fallback
    ran verl-serial; the note had read as if the pool ran two engines per device."""
    from jigsawrl.cli.real import searched_note

    co = {"runs": 2, "predicted_s": {"1": 1295.0, "2": 1268.0}}
    fell = searched_note({"colocation": co, "plan": {"runs": "verl-serial"}}) or ""
    own = searched_note({"colocation": co, "plan": {"runs": "jigsaw"}}) or ""
    assert "verl placement above runs instead" in fell
    assert "instead" not in own


def test_plan_note_says_why_a_verl_placement_runs_though_the_own_plan_is_sooner() -> None:
    """The 32B pair: own plan 1268 s, verl-serial 1295 s, verl-serial ran (the fallback's
    margin); the note had left a user to guess why."""
    from jigsawrl.cli.real import plan_note

    note = plan_note({"runs": "verl-serial", "jigsaw_s": 1268.0, "verl": "verl-serial",
                      "verl_s": 1295.0})
    assert "runs only if predicted 3% sooner" in note
    assert "runs only if" not in plan_note({"runs": "verl-queue-2", "jigsaw_s": 362.0,
                                            "verl": "verl-queue-2", "verl_s": 361.0})
