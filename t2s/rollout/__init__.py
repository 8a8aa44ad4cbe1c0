"""Playing episodes: training, evaluation (every mode, ``single`` included: it is an episode mode), ``ask`` and the
benchmarks play through here. Only a predictions file plays nothing: its SQL is recorded with
``t2s.env.record.one_turn_record``.

- ``driver``: :class:`~t2s.rollout.driver.Rollout` plays rows as episodes against a token backend (vLLM server,
  colocated vLLM, transformers, scripted text policies through ``backends.scripted``) and keeps each episode's raw
  token stream, logprobs and ``env_mask``; ``to_trl`` is what TRL's ``rollout_func`` returns.
- ``play``: one episode with a text policy (``policy(episode) -> str``: replayed turns, chat and tools endpoints),
  counting tokens with the same ``EnvTokenCounter`` when a tokenizer is given.

Both drive ``t2s.env.episode.Episode`` and return its ``t2s.env.record.EpisodeRecord``. It imports backends, scoring,
the environment and the foundation modules.
"""
