"""A keras.io-style GAN: its own `train_step` steps the optimizers it holds; `model.optimizer` never steps.

It compiles with `super().compile()`, so `model.optimizer` is Keras' default;
the critic's optimizer steps twice a batch and the generator's once (as in
keras.io's WGAN-GP). Shared by tests/callbacks/test_custom_train_step.py and
the multi-worker scenario (tests/multi_worker/mw_gan_worker.py).
"""

import keras
import numpy as np
import tensorflow as tf

import keras_scaling

NUM_SAMPLES = 256
PER_REPLICA_BATCH = 8
STEPS_PER_EPOCH = NUM_SAMPLES // (2 * PER_REPLICA_BATCH)  # 16 on 2 replicas
EPOCHS = 2
CRITIC_STEPS = 2
LATENT_DIM = 4


class GAN(keras.Model):
    def __init__(self, discriminator, generator):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.seed_generator = keras.random.SeedGenerator(1337)

    def compile(self, d_optimizer, g_optimizer):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    def train_step(self, real):
        batch_size = keras.ops.shape(real)[0]
        labels = keras.ops.concatenate(
            [keras.ops.ones((batch_size, 1)), keras.ops.zeros((batch_size, 1))], axis=0
        )
        for _ in range(CRITIC_STEPS):
            z = keras.random.normal((batch_size, LATENT_DIM), seed=self.seed_generator)
            combined = keras.ops.concatenate([self.generator(z), real], axis=0)
            with tf.GradientTape() as tape:
                d_loss = self.loss_fn(labels, self.discriminator(combined))
            weights = self.discriminator.trainable_weights
            self.d_optimizer.apply_gradients(zip(tape.gradient(d_loss, weights), weights))
        z = keras.random.normal((batch_size, LATENT_DIM), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            fooled = self.discriminator(self.generator(z))
            g_loss = self.loss_fn(keras.ops.zeros((batch_size, 1)), fooled)
        weights = self.generator.trainable_weights
        self.g_optimizer.apply_gradients(zip(tape.gradient(g_loss, weights), weights))
        return {"d_loss": d_loss, "g_loss": g_loss}


def build_gan(strategy, build_optimizers=True):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        discriminator = keras.Sequential(
            [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
        )
        generator = keras.Sequential(
            [keras.Input((LATENT_DIM,)), keras.layers.Dense(16, activation="relu")]
            + [keras.layers.Dense(8)]
        )
        gan = GAN(discriminator, generator)
        gan.compile(keras.optimizers.Adam(1e-3), keras.optimizers.Adam(1e-3))
        if build_optimizers:  # under tf.distribute, before the step that uses them
            gan.d_optimizer.build(discriminator.trainable_variables)
            gan.g_optimizer.build(generator.trainable_variables)
    gan.built = True  # Keras cannot build a model without call() from a batch
    return gan


def gan_data(strategy):
    x = np.random.default_rng(0).random((NUM_SAMPLES, 8)).astype("float32")
    return keras_scaling.data.distribute(
        x, strategy=strategy, per_replica_batch_size=PER_REPLICA_BATCH, shuffle=True, seed=0
    )


def state(gan):
    """Every weight, seed state and value of both optimizers, as numpy arrays."""
    variables = gan.variables + gan.d_optimizer.variables + gan.g_optimizer.variables
    return [np.asarray(v.numpy()) for v in variables]


class CrashAfter(keras.callbacks.Callback):
    def __init__(self, batches):
        super().__init__()
        self.batches = batches

    def on_train_batch_end(self, batch, logs=None):
        if batch + 1 == self.batches:
            raise RuntimeError("the machine went away")
