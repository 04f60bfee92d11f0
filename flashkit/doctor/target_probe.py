"""The part of the probe that runs inside the target interpreter (``--python``), not in flashkit's.

:func:`flashkit.doctor.probe._run_target` sends this whole module's source to
that interpreter and calls one entry function by name with JSON arguments:

- :func:`environment`: interpreter facts, watched distributions and the compiled
  modules of the packages, found without importing anything heavy;
- :func:`torch_facts`: ``import torch``, its facts, and the loader's verdict on
  each package and compiled module after it.

Each returns plain JSON values. The target may be any CPython 3.8 or newer
with nothing installed, so this module uses only the standard library of
Python 3.8, with no annotations and no flashkit imports.

Module-level imports are only those both children had loaded before their
work began (the torch child before ``import torch``). The environment's own
modules (importlib.metadata, platform, sysconfig) are imported inside its
functions: loaded in the torch child they would map extra libraries and show
up in the libraries it reports after ``import torch``.
"""

import importlib
import importlib.util
import os
import sys
import traceback

# ---------------------------------------------------------------------------
# The environment, without importing torch or the packages


def environment(watched, packages, top_level):
    """Interpreter, distributions in ``watched``, torch's location and the compiled modules to inspect."""
    errors = []
    owners = {}  # realpath of each .so a watched distribution lists -> its distribution name
    out = {"errors": errors, "interpreter": _interpreter()}
    out["distributions"] = _distributions(watched, owners, errors)
    torch_spec = _find_spec("torch", errors)
    out["torch_location"] = None
    if torch_spec is not None and torch_spec.submodule_search_locations and torch_spec.origin:
        out["torch_location"] = next(iter(torch_spec.submodule_search_locations))
    out["modules"] = _package_modules(packages, owners, errors) + _top_level_modules(top_level, owners, errors)
    return out


def _interpreter():
    import platform
    import sysconfig

    impl = sys.implementation.name
    ft = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    ver = sys.version_info
    return {
        "executable": sys.executable,
        "realpath": os.path.realpath(sys.executable),
        "version": f"{ver.major}.{ver.minor}.{ver.micro}",
        "implementation": impl,
        "tag": f"{'cp' if impl == 'cpython' else impl}{ver.major}{ver.minor}{'t' if ft else ''}",
        "machine": platform.machine(),
        "glibc": _glibc_version(),
        "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
        "libpython": _libpython(),
        "site_packages": _site_packages(),
    }


def _glibc_version():
    """The glibc version ("2.36"); None on another libc, or without confstr."""
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION")  # "glibc 2.36"
    except (ValueError, OSError, AttributeError):
        return None
    if libc and libc.startswith("glibc "):
        return libc.split()[1]
    return None


def _libpython():
    """The shared libpython the interpreter loads, when it is built shared."""
    import sysconfig

    if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        return None
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    ldlib = sysconfig.get_config_var("LDLIBRARY") or ""
    candidate = os.path.join(libdir, ldlib)
    if ldlib and os.path.exists(candidate):
        return os.path.realpath(candidate)
    return None


def _site_packages():
    import sysconfig

    site = []
    for key in ("purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p and p not in site:
            site.append(p)
    return site


def _distributions(watched, owners, errors):
    """The installed distributions among ``watched``, once each; records who owns each .so in ``owners``."""
    import importlib.metadata as md

    dists = []
    for name in watched:
        try:
            d = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        except Exception as exc:
            errors.append(["distribution " + name, repr(exc)])
            continue
        tags, installer = _wheel_info(d, name, errors)
        location = _locate(d, name, owners, errors)
        key = d.metadata["Name"]
        # "flash_kernels" and "flash-kernels" both find the one distribution
        if any(x["name"] == key for x in dists):
            continue
        dists.append(
            {"name": key, "version": d.version, "location": location, "wheel_tags": tags, "installer": installer}
        )
    return dists


def _wheel_info(d, name, errors):
    """(tags of the WHEEL file, INSTALLER), as far as they could be read."""
    tags = []
    installer = None
    try:
        for line in (d.read_text("WHEEL") or "").splitlines():
            if line.startswith("Tag:"):
                tags.append(line.split(":", 1)[1].strip())
        installer = (d.read_text("INSTALLER") or "").strip() or None
    except Exception as exc:
        errors.append(["wheel tags of " + name, repr(exc)])
    return tags, installer


def _locate(d, name, owners, errors):
    """Where ``d`` is installed (None when unknown); records the distribution of each .so it lists."""
    location = None
    try:
        location = str(d.locate_file(""))
        for f in d.files or []:
            if str(f).endswith(".so"):
                owners[os.path.realpath(str(d.locate_file(f)))] = d.metadata["Name"]
    except Exception as exc:
        errors.append(["files of " + name, repr(exc)])
    return location


def _find_spec(name, errors):
    try:
        return importlib.util.find_spec(name)
    except Exception as exc:
        errors.append(["find " + name, repr(exc)])
        return None


def _package_modules(packages, owners, errors):
    """Every .so under each installed package in ``packages``, skipping tests and caches."""
    modules = []
    for pkg in packages:
        spec = _find_spec(pkg, errors)
        # a namespace package (no __init__) is a source checkout on sys.path, not an install
        if spec is None or not spec.submodule_search_locations or not spec.origin or not os.path.isfile(spec.origin):
            continue
        for base in spec.submodule_search_locations:
            for dirpath, dirnames, filenames in os.walk(base):
                dirnames[:] = [d for d in dirnames if d not in ("__pycache__", "tests")]
                for fn in sorted(filenames):
                    if fn.endswith(".so"):
                        path = os.path.join(dirpath, fn)
                        rel = os.path.relpath(path, os.path.dirname(base))[: -len(".so")]
                        modname = rel.split(".")[0].replace(os.sep, ".")
                        modules.append(_module_entry(path, pkg, modname, owners))
    return modules


def _top_level_modules(top_level, owners, errors):
    """The compiled modules installed as top-level names (flash-attn's ``flash_attn_2_cuda``)."""
    modules = []
    for name in top_level:
        spec = _find_spec(name, errors)
        if spec is not None and spec.origin and spec.origin.endswith(".so"):
            modules.append(_module_entry(spec.origin, name, name, owners))
    return modules


def _module_entry(path, package, module, owners):
    return {
        "path": path,
        "package": package,
        "module": module,
        "distribution": owners.get(os.path.realpath(path)),
    }


# ---------------------------------------------------------------------------
# import torch, then the packages and their compiled modules


def torch_facts(packages, extensions):
    """What ``import torch`` says, then whether each package and extension (name, path) loads after it."""
    out = {"imported": False, "import_error": None, "modules": {}}
    try:
        import torch
    except BaseException as exc:
        out["import_error"] = _exception_text(exc)
        return out
    out["imported"] = True
    out["version"] = str(torch.__version__)
    out["cuda"] = getattr(torch.version, "cuda", None)
    out["hip"] = getattr(torch.version, "hip", None)
    out["cxx11_abi"] = bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", False))
    out.update(_cuda_facts(torch))
    out["modules"].update(_import_errors(packages, extensions))
    out["loaded_libraries"] = _mapped_libraries()
    return out


def _exception_text(exc):
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()[-2000:]


def _cuda_facts(torch):
    """cuda_available, devices and arch_list; cuda_error (with what was read before it) when CUDA raises."""
    out = {}
    devices = []
    try:
        out["cuda_available"] = bool(torch.cuda.is_available())
        if out["cuda_available"]:
            for i in range(torch.cuda.device_count()):
                major, minor = torch.cuda.get_device_capability(i)
                devices.append({"name": torch.cuda.get_device_name(i), "capability": f"{major}.{minor}"})
        out["arch_list"] = list(torch.cuda.get_arch_list()) if out["cuda_available"] else []
    except BaseException as exc:
        out["cuda_error"] = _exception_text(exc)
    out["devices"] = devices
    return out


def _import_errors(packages, extensions):
    """Import error (None: it loaded) by package name and by extension path."""
    # packages as a user imports them; extension files loaded by path, so the loader's
    # verdict on each file is not hidden behind its package's own imports
    errors = {}
    for name in packages:
        try:
            importlib.import_module(name)
            errors[name] = None
        except BaseException as exc:
            errors[name] = _exception_text(exc)
    for name, path in extensions:
        try:
            spec = importlib.util.spec_from_file_location(name, path)
            spec.loader.create_module(spec)
            errors[path] = None
        except BaseException as exc:
            errors[path] = _exception_text(exc)
    return errors


def _mapped_libraries():
    """The shared objects mapped into this process, in map order."""
    loaded = []
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 6 and ".so" in parts[5] and parts[5] not in loaded:
                    loaded.append(parts[5])
    except OSError:
        pass
    return loaded
