"""The guarded reaches into Keras' and TensorFlow's private names, in one place.

Each private name is read here only, behind a probe (`_probes`) that answers
"is it there, and of the shape I know?"; when it says no, the feature that
needs it turns itself off with one warning naming the versions and what is
lost.

- `_probes`: the probe registry and its one warning;
- `_versions`: the installed Keras and TensorFlow, and the supported range;
- `_keras`: private Keras names outside the trainer (layers, optimizers,
  variables);
- `_tf_data`: a dataset's inputs and graph, an iterator's dataset, a
  per-replica spec;
- `_tf_data_batching`: how a dataset was batched, and what Keras' directory
  utilities decode each file with.

The Keras fixes of `keras_scaling.compat` read the trainer's private names
through the same probes, in `compat`'s own modules.
"""
