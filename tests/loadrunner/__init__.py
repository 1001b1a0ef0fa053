"""Tests of the load runner room (`h3batch.loadrunner`): driver, reference server and sweeps."""
