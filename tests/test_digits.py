"""The embedded digits set is scikit-learn's, read without importing scikit-learn, split as scikit-learn splits it."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from vitdeploy.model.data import DIGITS_SPLIT_SEED, DIGITS_VAL_FRACTION, digits_images, digits_split


def test_the_digits_are_scikit_learns_images_and_labels() -> None:
    from sklearn.datasets import load_digits

    d = load_digits()
    imgs, y = digits_images()
    assert len(imgs) == len(d.images) == 1797 and imgs[0].size == (8, 8) and imgs[0].mode == "L"
    np.testing.assert_array_equal(y, d.target)
    np.testing.assert_array_equal(np.stack([np.asarray(i) for i in imgs]), np.round(d.images * (255.0 / 16.0)))


def test_the_split_is_scikit_learns_stratified_split() -> None:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    y = load_digits().target
    tr, va = train_test_split(np.arange(len(y)), test_size=DIGITS_VAL_FRACTION, random_state=DIGITS_SPLIT_SEED,
                              stratify=y)
    got_tr, got_va = digits_split()
    np.testing.assert_array_equal(got_tr, np.sort(tr))
    np.testing.assert_array_equal(got_va, np.sort(va))


def test_loading_the_digits_does_not_import_scikit_learn() -> None:
    code = ("import sys; from vitdeploy.model.data import digits_images, digits_split; digits_images(); digits_split(); "
            "print(sorted(m for m in ('sklearn', 'scipy') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert r.stdout.strip() == "[]", r.stdout
