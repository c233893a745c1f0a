"""The error a compat module gives for a name it does not provide."""


def missing_name(module: str, name: str, provided: list[str]):
    if name.startswith("__"):  # Python's own probes (__path__, __file__ ...) must see a plain AttributeError
        return AttributeError(name)
    have = ", ".join(provided) or "no names, only submodules"
    return ImportError(
        f"{module}.{name} is not provided by slime-check's slime compatibility layer (it has: {have}); "
        "rehearse this hook on a machine with slime installed (slime-check smoke --with slime), "
        "or see skill/references/smoke.md for the names it provides", name=module)
