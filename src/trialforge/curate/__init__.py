"""Curation steps: turn validated tasks into a training set that is safe to train on.

``decontam`` drops tasks that copy or nearly copy benchmark or eval-split content, and
keeps the train and eval splits apart; ``ngrams`` and ``minhash`` are its hashing layers.
"""
