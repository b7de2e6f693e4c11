"""kagtpl: Kaggle competition projects that keep the GPU busy and always hand in a submission."""

__version__ = "0.6.0"
