"""On the V1 runner's glue (vLLM 0.32): each step drafts the depth vLLM's per-batch-size schedule
gives it (num_speculative_tokens_per_batch_size), so a step's drafting work follows the scheduled
depth, not the maximum; outputs stay the target's. The same check runs on the 0.34 engine
(test_v2_runner_drafting_follows_the_scheduled_depth.py); tests/support/depth_schedule.py holds it."""

from support.depth_schedule import KIND, check_schedule_costs_what_it_drafts


def test_a_step_drafts_and_costs_the_depth_the_schedule_gives_it(target_dirs, trained_drafts):
    check_schedule_costs_what_it_drafts(target_dirs(KIND), trained_drafts(KIND))
