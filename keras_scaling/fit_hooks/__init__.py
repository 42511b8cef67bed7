"""How keras_scaling's callbacks hook into `fit`: what every one of them shares.

- `_train_function_hook`: per-step work in a wrapper of `model.train_function`
  (which `fit` calls once per `steps_per_execution` steps), not in a batch
  hook, which would make Keras wait for every step;
- `_fit_end`: undoing what a callback changed for one `fit`, however it ends;
- `_trace_count`: how often the train step was traced, from the public
  `train_step`;
- `_step_counter`: the one reader of the step counter, the batches trained.
"""
