"""Each test file's kind, a pytest marker (`pytest -m fast`, `make test-fast`):

  fast    torch and the package only (no engine, no training fixture): the whole kind runs in
          well under a minute, the loop to run while editing the draft core
  engine  vLLM engines in process, trained tiny drafts, CLI subprocesses, training runs
  server  `vllm serve` (or the example server) over HTTP
  demo    the shipped demo models: their benchmark, demo, README examples and training commands
  v2_runner the V2 runner's glue under the Python of a release that runs it (`make test-v2-runner`:
          the side environment of vllm_sparrow/releases.py's side_env release, tools/vllm_side_env.py);
          skipped, saying so, where the installed vLLM's runner is not V2

conftest.py marks every test with its file's kind and refuses a test file that is not listed
here, so a new file is classified when it is added. Each kind has a time budget (BUDGET_S, the
seconds its tests may take in one run here, summed over the lanes that ran them, set-up and
teardown of the fixtures they start included); conftest reports every kind's time against it
at the end of a run and names a kind over its budget, so a slow newcomer is seen the day it
lands. The suite's own aim: `bash .ci/run` on a fresh clone inside 30 minutes, set-up included.
"""

KINDS = {
    # fast
    "test_cli_options_come_from_configs": "fast",
    "test_cpu_expand_kernel_fix": "fast",
    "test_documented_commands_parse": "fast",
    "test_gpu_check_runs_without_vllm": "fast",
    "test_sampled_drafts_keep_q_where_vllm_reads_it": "fast",
    "test_seeded_drafts_repeat_whatever_shares_their_step": "fast",
    "test_draft_cache_matches_dense_reference": "fast",
    "test_drafts_past_32768_positions_match_the_dense_reference": "fast",
    "test_environment_is_read_in_one_place": "fast",
    "test_freed_host_memory_goes_back_to_the_os": "fast",
    "test_modules_meet_through_public_interfaces": "fast",
    "test_mtp_stages_replay_inference": "fast",
    "test_mtp_depth_benchmark_cuts_chains_exactly": "fast",
    "test_tuned_draft_times_the_engine_bench_serves": "fast",
    "test_visual_kv_baselines_train_on_long_videos": "fast",
    "test_product_never_imports_the_kit": "fast",
    "test_published_numbers_come_from_their_files": "fast",
    "test_serving_layer_matches_training_model": "fast",
    "test_target_training_labels_follow_the_frames": "fast",
    "test_tree_replay_measures_chains_and_trees": "fast",
    "test_tree_search_drafts_best_path": "fast",
    "test_drafting_choice_follows_its_rule": "fast",
    "test_adaptive_length_stops_drafting_early": "fast",
    "test_vllm_patches_are_declared": "fast",
    "test_window_rule_matches_written_out_masks": "fast",
    "test_world_captions_follow_the_frames": "fast",
    "test_hard_world_captions_say_the_scene_many_ways": "fast",
    "test_demo_build_drafts_only_keeps_the_shipped_target": "fast",
    "test_target_trains_on_the_long_clips_it_is_benchmarked_at": "fast",
    "test_model_card_needs_no_stage1_log": "fast",
    # engine
    "test_async_scheduling_allowed_for_sparrow": "engine",
    "test_bad_speculative_config_fails_at_startup": "engine",
    "test_batch_captioning_resumes_and_keeps_errors": "engine",
    "test_capture_skips_bad_samples_and_resumes": "engine",
    "test_capture_keeps_a_share_of_ivsb_states": "engine",
    "test_engine_capture_keeps_videos_past_the_default_encoder_cache": "engine",
    "test_capture_splits_over_processes_and_checks_the_disk": "engine",
    "test_cuda_graphs_and_bf16_are_lossless": "engine",
    "test_demo_build_redoes_work_of_old_target": "engine",
    "test_draft_graph_buckets_draft_like_eager": "engine",
    "test_drafting_follows_the_scheduled_depth": "engine",
    "test_draft_slots_freed_after_aborts_and_preemption": "engine",
    "test_per_request_state_stays_bounded": "engine",
    "test_served_requests_leave_no_memory_behind": "engine",
    "test_draft_step_cost_does_not_grow_with_batch": "engine",
    "test_durable_writes_survive_kill_9": "engine",
    "test_engine_capture_equals_transformers_capture": "engine",
    "test_eagle3_baseline_serves_in_vllm": "engine",
    "test_eagle_baseline_trains_and_serves": "engine",
    "test_engine_shutdown_frees_the_target": "engine",
    "test_engines_die_with_their_command": "engine",
    "test_greedy_lossless_per_target": "engine",
    "test_ivsb_dropout": "engine",
    "test_kernel_benchmark_runs": "engine",
    "test_lossless_sampling_matrix": "engine",
    "test_lossless_with_chunked_prefill_and_prefix_hits": "engine",
    "test_mixed_step_benchmark": "engine",
    "test_mixed_steps_run_on_packed_rows": "engine",
    "test_online_training_equals_training_from_a_capture": "engine",
    "test_patch_targets_exist_in_vllm_source": "engine",
    "test_plugin_installs_into_an_existing_vllm": "engine",
    "test_probe_layers_suggests_ivsb_layer": "engine",
    "test_ray_caption_equals_one_process_caption": "engine",
    "test_ray_capture_equals_engine_capture": "engine",
    "test_ray_extra_installs_beside_vllm": "engine",
    "test_pyav_video_codec_in_vllm": "engine",
    "test_reduced_draft_vocabulary": "engine",
    "test_respond_writes_the_targets_answers_through_vllm": "engine",
    "test_sampling_distribution_matches_target": "engine",
    "test_setup_checks_the_gpu": "engine",
    "test_train_resume_is_exact": "engine",
    "test_trained_draft_recommends_the_depth_it_measured": "engine",
    "test_training_pipeline_end_to_end": "engine",
    "test_triton_request_noise_matches_torch": "engine",
    "test_triton_window_attention_matches_torch": "engine",
    "test_two_process_training_matches_one": "engine",
    "test_verify_applies_request_parameters_to_drafted_rows": "engine",
    # server
    "test_data_parallel_serving_with_sparrow": "server",
    "test_example_server_answers_about_the_longest_clip": "server",
    "test_local_media_without_allowed_path_gets_a_400": "server",
    "test_openai_server_with_sparrow": "server",
    "test_plugin_never_stops_vllm": "server",
    "test_readme_shell_examples_run_as_written": "server",
    "test_request_parameters_behave_as_without_sparrow": "server",
    "test_video_decoding_is_bounded": "server",
    # demo
    "test_bfloat16_divergence_is_the_targets_own": "demo",
    "test_confidence_calibration_benchmark_runs": "demo",
    "test_draft_step_cache_benchmark": "demo",
    "test_deep_drafts_are_lossless": "demo",
    "test_tune_chooses_depth_per_batch_size": "demo",
    "test_demo_models_caption_and_accept": "demo",
    "test_hard_demo_models_caption_and_accept": "demo",
    "test_long_video_benchmark": "demo",
    "test_readme_offline_example_runs_as_written": "demo",
    "test_tensor_parallel_is_lossless": "demo",
    "test_training_commands_run_as_written": "demo",
    # v2_runner
    "test_v2_runner_caption_respond_and_tune_match_the_v1_runner": "v2_runner",
    "test_v2_runner_demo_and_bench_match_the_v1_runner": "v2_runner",
    "test_v2_runner_drafting_follows_the_scheduled_depth": "v2_runner",
    "test_v2_runner_engine_capture_equals_transformers_capture": "v2_runner",
    "test_v2_runner_pyav_loader_decodes_as_the_v1_codec_does": "v2_runner",
    "test_v2_runner_registers_sparrow_through_vllms_registry": "v2_runner",
    "test_v2_runner_greedy_outputs_are_the_targets": "v2_runner",
    "test_v2_runner_sampled_outputs_follow_the_targets_distribution": "v2_runner",
    "test_v2_runner_request_parameters_behave_as_without_sparrow": "v2_runner",
    "test_v2_runner_server_answers_video_chats_with_sparrow": "v2_runner",
    "test_v2_speculator_drafts_like_the_dense_reference": "v2_runner",
}

# `make test` runs two pytest-xdist workers (JOBS in the Makefile): a worker takes one unit at a
# time, a unit being one test file, or a group of files below that must share one worker: the Ray
# files (one local Ray cluster at a time on this machine)
# the two readers of the session's `sparrow bench --quick` (conftest's quick_bench, run once),
# and the files that share servers (support/shared_servers.py: started once, stopped after them).
GROUPS = {
    "ray": ["test_ray_caption_equals_one_process_caption",
            "test_ray_capture_equals_engine_capture", "test_ray_extra_installs_beside_vllm"],
    "quick_bench": ["test_demo_models_caption_and_accept", "test_long_video_benchmark"],
    # the two `vllm serve` processes of support/shared_servers.py, with and without Sparrow
    "servers": ["test_local_media_without_allowed_path_gets_a_400", "test_openai_server_with_sparrow",
                "test_request_parameters_behave_as_without_sparrow"],
    "v2_servers": ["test_v2_runner_request_parameters_behave_as_without_sparrow",
                   "test_v2_runner_server_answers_video_chats_with_sparrow"],
}

# Workers take units in this order: the long ones first (these, longest first as measured, then
# kind by kind), so that the two workers end together instead of one waiting out a long unit
# taken last (conftest's pytest_xdist_make_scheduler). The V2 runner's files run in a session of
# their own (`make test-v2-runner`), where their long ones lead the same way.
UNIT_ORDER = ["ray", "quick_bench",
              "test_v2_runner_caption_respond_and_tune_match_the_v1_runner",
              "test_v2_runner_sampled_outputs_follow_the_targets_distribution",
              "test_v2_runner_demo_and_bench_match_the_v1_runner",
              "test_v2_runner_greedy_outputs_are_the_targets", "v2_servers",
              "test_v2_runner_pyav_loader_decodes_as_the_v1_codec_does"]
KIND_ORDER = ["demo", "server", "engine", "v2_runner", "fast"]

HELP = {
    "fast": "torch and the package only, seconds (make test-fast)",
    "engine": "vLLM engines in process, trained tiny drafts, CLI subprocesses",
    "server": "vllm serve over HTTP",
    "demo": "the shipped demo models: bench, demo, README examples",
    "v2_runner": "the V2 runner's glue in its side environment (make test-v2-runner)",
}

# Seconds per kind per run on the CI machine (2 cores, two lanes): the seconds of each kind's
# tests summed over the lanes, measured in a fresh-clone `bash .ci/run` (2026-12-07, first run:
# fast 98, engine 1,412, server 419, demo 745, v2_runner 883), with ~10% of room, so a newcomer
# that makes its kind slower is named the day it lands. Two later fresh-clone runs of this
# machine (commits 460cd3d, fac2493) gave fast 114 / 92, engine 1,646 / 1,534, server 374 / 395,
# demo 735 / 697, v2_runner 943 / 907: a run's lane-seconds vary by ~7%, with what each lane's
# neighbour runs. The suite's wall time is about half their sum plus set-up. At 9d194eb (the
# plugin's table cases in one process, the memory check at 500 requests), with nothing else
# running on the machine: 1,599 s in all (set-up ~140 s, V1 session 1,104 s, V2 354 s; fast 83,
# engine 1,146, server 290, demo 650, v2_runner 652); at a66ea77, 1,571 s (V1 1,043 s, V2 417 s;
# fast 92, engine 1,112, server 289, demo 561, v2_runner 775). Runs vary more than that: the V1
# session took 1,433 s in the working tree three hours before, with the machine nearly idle, and
# this stop's cuts explain ~130 lane-seconds of the difference; time a run with the machine left
# to it, and compare runs of one sitting. The budgets: the larger of those two runs, plus ~15%.
# Stop 67 added the request-parameter matrix (server, v2_runner) and the bfloat16 departures
# (demo): at b532f17, 1,867 s in all (V1 1,204 s: fast 88, engine 1,235, server 333, demo 708;
# V2 534 s: v2_runner 998); at d1b6426 (the matrix sent at once), 2,022 s (V1 1,375 s in a slow
# phase, the unchanged tests 11-30% slower than the run before: fast 96, engine 1,355, server 396,
# demo 857; V2 495 s: v2_runner 942). The budgets stay: the kinds they name are what to cut.
BUDGET_S = {
    "fast": 105,
    "engine": 1300,
    "server": 335,
    "demo": 750,
    "v2_runner": 890,
}
