"""`sparrow caption` and `sparrow capture --engine` across GPUs and machines, on a Ray cluster.

The same commands with `--ray ADDRESS` (`local`: a cluster started on this machine for the
command) and `--replicas N`. The design is Ray Data's for offline inference (what `ray.data.llm`
builds): the items are a Ray Dataset, streamed through `map_batches` into a pool of N actors, each
actor an engine replica holding one vLLM `LLM` (with the Sparrow draft for captions), with the
Dataset's back-pressure between them. What stays the command's own:

- one driver writes the output. Caption rows come back to the driver, which appends them
  through durable.py exactly as the one-process command does; a capture replica writes its shard
  file whole (shards.write_shard) and the driver lists it in the manifest. Resume is the
  driver's, as before: a rerun skips what the output (or manifest) holds;
- exactly once. Ray Data restarts a killed replica and runs its batch again, so a batch can come
  back twice; the driver writes an id (a sample) only once per run, whichever copy comes first;
- nothing outlives the job. A replica records itself as the command its engine processes die with
  (lifetime.py); Ray ends a dead driver's actors; a `local` cluster is shut down on every way out,
  and a watchdog (watchdog.py) ends what Ray leaves of it after a kill -9 of the command.

The jobs themselves (batch_caption.py, training/capture.py) know nothing of Ray: the command
chooses the one-process job or its Ray form here (caption_on_ray, capture_on_ray), and the Ray form
reuses the job through its public functions.

Modules: options.py (the knobs both commands take), cluster.py (connecting, starting `local`,
the environment replicas get), watchdog.py, replicas.py (Dataset to actor pool to the driver),
caption.py and capture.py (each command's Ray form: its replica and driver loop). Ray itself is the
optional extra `pip install 'vllm-sparrow[ray]'`; nothing here imports it until a command asks for a
cluster.
"""
