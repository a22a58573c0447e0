"""Benchmarks besides StableToolBench's (which `evaluation.benchmark` runs): API-Bank (`apibank`) and ToolEyes
(`tooleyes`) on our virtual server."""
