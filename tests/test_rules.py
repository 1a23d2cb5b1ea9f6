"""The operator interface: every plan node has a rule, checked when the compiler is imported."""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import delta_operators.compiler as compiler
from sql_frontend.plan import Node
from delta_operators.rule import RULES, Rule, check_rules, missing_rules, plan_node_types, rule_for
from delta_operators.state_reads import StateRule

ROOT = Path(__file__).resolve().parent.parent


@dataclass(eq=False)
class Fake(Node):
    """A plan node type no rule was written for."""

    columns: tuple = ()


class FakeRule(Rule):
    def delta(self, ctx):  # noqa: ANN001, ANN201
        return None

    def scan(self, ctx, mode):  # noqa: ANN001, ANN201
        raise NotImplementedError

    def lookup(self, ctx, columns, probe, probe_columns, mode):  # noqa: ANN001, ANN201
        return None

    def states(self, ctx):  # noqa: ANN001, ANN201
        return []


def test_every_plan_node_type_has_a_registered_rule():
    names = {t.__name__ for t in plan_node_types()}
    assert {"Source", "SPJ", "Aggregate", "Distinct", "UnionAll", "SemiJoin", "SetOp", "Window", "Session", "TopK",
            "Recursive", "RecursiveRef"} <= names
    assert missing_rules(plan_node_types(), RULES) == []
    assert all(issubclass(rule, Rule) for rule in RULES.values())
    check_rules()


def test_the_check_names_a_node_type_without_a_rule():
    node_types = plan_node_types() + [Fake]
    assert missing_rules(node_types, RULES) == [Fake]
    with pytest.raises(ImportError, match=r"no delta rule for plan node Fake\b"):
        check_rules(node_types)
    rule_for(Fake)(FakeRule)  # registered: the check passes ...
    try:
        check_rules(node_types)
    finally:
        del RULES[Fake]
    with pytest.raises(ImportError, match="Fake"):  # ... unregistered: it fails again
        check_rules(node_types)


def test_importing_the_compiler_fails_on_a_plan_node_without_a_rule():
    """A node type added to sql_frontend/plan.py without a rule stops the compiler's import, naming it."""
    script = (
        "from dataclasses import dataclass\n"
        "import sql_frontend.plan as plan\n"
        "@dataclass(eq=False)\n"
        "class Pivot(plan.Node):\n"
        "    columns: tuple = ()\n"
        "Pivot.__module__ = plan.__name__\n"
        "import delta_operators.compiler\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode != 0
    assert "ImportError: no delta rule for plan node Pivot" in done.stderr


def test_a_second_rule_for_one_node_type_is_refused():
    from sql_frontend.plan import Distinct

    with pytest.raises(TypeError, match="Distinct has two rules"):
        rule_for(Distinct)(FakeRule)
    assert RULES[Distinct].__name__ == "DistinctRule"


def test_optional_abilities_default_to_the_safe_answer():
    rule = FakeRule(Fake())
    assert rule.can_lookup(None, ("a",)) is False
    assert rule.unique(("a",)) is False
    assert rule.is_global is False
    assert rule.between(None, "a", "probe", "v", compiler.OLD) is None
    assert rule.old_is_empty(None) is False


def test_a_rule_must_define_the_four_required_methods():
    class Partial(Rule):
        def delta(self, ctx):  # noqa: ANN001, ANN201
            return None

    with pytest.raises(TypeError, match="abstract"):
        Partial(Fake())


def test_state_rules_are_the_rules_that_read_their_own_state():
    state_rules = sorted(t.__name__ for t, rule in RULES.items() if issubclass(rule, StateRule))
    assert state_rules == ["Aggregate", "Distinct", "Recursive", "RecursiveRef", "SemiJoin", "Session", "SetOp",
                           "TopK", "Window"]


def test_no_rule_module_imports_the_compiler_and_the_compiler_imports_at_the_top():
    """The compiler sits above the rules: no circle, so no import inside a function either."""
    package = ROOT / "delta_operators"
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        if path.name != "compiler.py":
            assert "delta_operators.compiler" not in imported, path.name
    tree = ast.parse((package / "compiler.py").read_text())
    for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        assert not [n for n in ast.walk(function) if isinstance(n, (ast.Import, ast.ImportFrom))], function.name
    assert len(compiler.RULE_MODULES) == len({rule.__module__ for rule in RULES.values()})
