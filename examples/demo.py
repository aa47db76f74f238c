"""`make demo`: start a local lounge with TensorFlow preloaded, train a small sweep of Keras
classifiers on scikit-learn's breast-cancer tissue data across the engines, print the
results and the launch time, and stop.

    python examples/demo.py [--engines N] [--kind ipyparallel|dask]
"""

from __future__ import annotations

import argparse
import os
import time


def train(lr: float, units: int, epochs: int) -> dict:
    """Train one small classifier; runs inside an engine, where TensorFlow is already imported."""
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    x, y = load_breast_cancer(return_X_y=True)
    x_tr, x_val, y_tr, y_val = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    scaler = StandardScaler().fit(x_tr)
    x_tr, x_val = (
        scaler.transform(x_tr).astype("float32"),
        scaler.transform(x_val).astype("float32"),
    )
    tf.random.set_seed(int(os.environ.get("LOUNGE_RANK", "0")))
    model = tf.keras.Sequential(
        [
            tf.keras.Input((x.shape[1],)),
            tf.keras.layers.Dense(units, activation="relu"),
            tf.keras.layers.Dense(1, activation="sigmoid"),
        ]
    )
    model.compile(tf.keras.optimizers.Adam(lr), "binary_crossentropy", metrics=["accuracy"])
    model.fit(x_tr, y_tr, epochs=epochs, batch_size=32, verbose=0)
    _, val_accuracy = model.evaluate(x_val, y_val, verbose=0)
    return {"val_accuracy": round(float(val_accuracy), 4), "n_val": int(np.size(y_val))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=4, help="number of engines (default 4)")
    parser.add_argument("--kind", default="ipyparallel", help="ipyparallel (default) or dask")
    args = parser.parse_args()

    from jupyter_lounge import Lounge

    print(f"Starting {args.engines} {args.kind} engines on this machine, TensorFlow preloaded...")
    t0 = time.perf_counter()
    lounge = Lounge(
        args.engines,
        engines=args.kind,
        preload=["tensorflow", "sklearn"],
        wait=True,
        timeout=300,
    )
    lounge.start_sync()
    launch = time.perf_counter() - t0
    try:
        grid = [
            {"lr": lr, "units": units, "epochs": 15}
            for lr in (0.001, 0.01)
            for units in (4, 16, 64)
        ]
        t1 = time.perf_counter()
        results = lounge.map(train, grid)
        sweep = time.perf_counter() - t1
        import pandas as pd

        with pd.option_context("display.width", 120):
            print(
                results[["lr", "units", "epochs", "val_accuracy", "engine", "host", "seconds"]]
                .sort_values("val_accuracy", ascending=False)
                .to_string(index=False)
            )
        if results["error"].notna().any():
            raise SystemExit(f"some items failed:\n{results['error'].dropna().tolist()}")
        print(
            f"\nLaunch: {args.engines} engines registered with TensorFlow imported in "
            f"{launch:.1f} s; sweep of {len(grid)} models in {sweep:.1f} s."
        )
    finally:
        lounge.stop_sync()
        print(f"Stopped {lounge.name}; nothing of it is left running.")


if __name__ == "__main__":
    main()
