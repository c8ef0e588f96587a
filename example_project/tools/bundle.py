"""pyrule functions.  A pyrule names one of them as "tools.bundle:bundle_modules".

buildtool calls it in a separate Python process, with the package directory as the
current directory, as ``fn(srcs=[...], outs=[...], **kwargs)``.  It must write every
path in ``outs``.  Its cache key covers this module's source (and the workspace modules
it imports), the Python version and the kwargs, so editing this file reruns it.
"""

import ast


def bundle_modules(srcs, outs, header="", **_):
    """Normalise several small modules into one: hoist and de-duplicate the imports,
    drop module docstrings and trailing whitespace, keep everything else in order."""
    (out,) = outs
    imports, bodies = [], []
    for src in srcs:
        with open(src, encoding="utf-8") as f:
            text = f.read()
        tree = ast.parse(text, filename=src)
        lines = text.splitlines()
        body = []
        for node in tree.body:
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            seg = lines[start - 1 : node.end_lineno]
            if isinstance(node, ast.Import | ast.ImportFrom):
                imports.extend(seg)
            elif (
                node is tree.body[0]
                and isinstance(node, ast.Expr)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                continue  # the module docstring
            else:
                body.append("\n".join(line.rstrip() for line in seg))
        bodies.append(f"# --- from {src} ---\n" + "\n\n\n".join(body))
    parts = []
    if header:
        parts.append(f"# {header}")
    parts.append("\n".join(sorted(set(imports))))
    parts.extend(bodies)
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n\n\n".join(p for p in parts if p) + "\n")
