"""Playing episodes: training, evaluation (every mode, ``single`` included: it is an episode mode), ``ask`` and the
benchmarks play through one driver.

- ``driver``: :class:`~t2s.rollout.driver.Rollout` plays rows as episodes against a backend and keeps each episode's
  raw token stream, logprobs and ``env_mask``; ``to_trl`` is what TRL's ``rollout_func`` returns. A token backend
  (vLLM server, colocated vLLM, transformers) samples the turns; a turn backend writes them.
- ``text_policy``: the turn backend of text policies (``policy(episode) -> str``: replayed and scripted turns, the gold
  policy, chat and tools endpoints, a predictions file's answers), and ``play`` / ``run_text_episode`` for one
  episode on the calling thread.
- ``tokens``: the token accounting every episode shares (the first prompt, the environment's suffixes);
- ``trace``: what an episode leaves (``EpisodeTrace``) and the batch of traces TRL receives (``to_trl``).

Every episode drives ``t2s.env.episode.Episode`` and returns its ``t2s.env.record.EpisodeRecord``. The package
imports backends, scoring, the environment and the foundation modules.
"""
