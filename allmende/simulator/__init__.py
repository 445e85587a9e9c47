"""The what-if simulator's runs: the platform as a policy, and a simulated run through the real pipeline."""
