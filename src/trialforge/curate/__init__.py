"""Curation: from validated tasks to a training set that is clean, split and well sampled.

``decontam`` drops tasks that copy or nearly copy benchmark or eval-split content and keeps
the train and eval splits apart (``ngrams`` and ``minhash`` are its hashing layers);
``difficulty`` and ``tiers`` measure how hard each task is; ``sampler`` builds batches
that keep the learning signal alive.
"""
