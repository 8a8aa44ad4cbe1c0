"""Training and evaluation data: loaders into one row shape, difficulty estimation, gold hygiene, pass-rate filter."""
