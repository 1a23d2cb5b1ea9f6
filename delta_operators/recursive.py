"""WITH RECURSIVE (placeholder until the rule lands)."""


class RecursiveRule:
    def __init__(self, node):
        raise NotImplementedError


class RecursiveRefRule(RecursiveRule):
    pass
