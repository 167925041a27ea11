"""Transitional (issue 44): storage/trees.py was split into modules named for what they hold, and
this module goes as soon as its last importer (in files other engineers are editing) has moved:
storage.clock (now_iso, iso_in), storage.ids (new_id), storage.new_tree (prepare_new_tree, the
checks, TreeError), storage.tree_graph (cycles, children, dependents), storage.task_view
(public, PublicView, nest), storage.copy_plan (copy and clone planning). Import from those.
"""

from taskgrove.storage.clock import now_iso
from taskgrove.storage.copy_plan import RESETTABLE, connect, copy_selection, plan_copies, reset_values
from taskgrove.storage.ids import new_id
from taskgrove.storage.new_tree import (
    DEFAULT_MAX_TREE_TASKS,
    TreeError,
    label,
    normalize_dependencies,
    prepare_new_tree,
    too_many_tasks,
)
from taskgrove.storage.task_view import PublicView, nest, public
from taskgrove.storage.tree_graph import (
    children_index,
    dependents_index,
    find_cycle,
    format_cycle,
    subtree_ids,
    transitive,
)

__all__ = ["DEFAULT_MAX_TREE_TASKS", "RESETTABLE", "PublicView", "TreeError", "children_index", "connect", "copy_selection",
           "dependents_index", "find_cycle", "format_cycle", "label", "nest", "new_id", "normalize_dependencies",
           "now_iso", "plan_copies", "prepare_new_tree", "public", "reset_values", "subtree_ids", "too_many_tasks",
           "transitive"]
