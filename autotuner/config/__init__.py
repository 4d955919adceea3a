"""What a config is: the knobs every backend has, their values, and a config's identity and form.

The lowest layer of the engine after `autotuner.errors`: the backends build their knob tables from
it, and every stage above speaks of configs in its terms.
"""
