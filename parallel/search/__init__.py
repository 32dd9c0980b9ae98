"""Plan search (pure): the candidate funnel and its vectorised evaluation through parallel.core's
own formulas (space.py). The command is parallel/cli/search.py.
"""
