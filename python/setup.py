"""Builds libweft from the checkout (CMake) and the torch extension against it.

`pip install ./python` is the whole install: libweft.so is copied next to the
extension, which finds it through an $ORIGIN rpath.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import setup

try:
    import torch  # noqa: F401
except ImportError:
    # pip builds in an isolated environment without torch; the extension must
    # be compiled against the torch it will run with, the target environment's.
    sys.path.append(sysconfig.get_paths()["purelib"])
from torch.utils.cpp_extension import BuildExtension, CppExtension, include_paths

ROOT = Path(__file__).resolve().parent.parent
# WEFT_CMAKE_BUILD_DIR reuses a build folder (the test script passes its own).
BUILD = Path(os.environ.get("WEFT_CMAKE_BUILD_DIR", ROOT / "build-python")).resolve()
SOURCES = ["weft_torch/csrc/backend.cc", "weft_torch/csrc/module.cc"]


def build_libweft():
    if not (BUILD / "CMakeCache.txt").exists():
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        subprocess.check_call(
            ["cmake", "-S", str(ROOT), "-B", str(BUILD), *generator,
             "-DCMAKE_BUILD_TYPE=RelWithDebInfo", "-DWEFT_BUILD_TESTS=OFF",
             "-DWEFT_BUILD_BENCH=OFF"])
    subprocess.check_call(
        ["cmake", "--build", str(BUILD), "--target", "weft", "-j", str(os.cpu_count() or 1)])


class Build(BuildExtension):
    def run(self):
        build_libweft()
        super().run()
        # The soname the extension needs, beside it in the package.
        library = (BUILD / "lib" / "libweft.so").resolve()
        soname = "libweft.so." + library.name.split(".so.")[1].split(".")[0]
        target = Path(self.build_lib) / "weft_torch" / soname
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(library, target)
        if self.inplace:
            shutil.copyfile(library, Path(__file__).parent / "weft_torch" / soname)


setup(
    ext_modules=[
        CppExtension(
            "weft_torch._C",
            SOURCES,
            include_dirs=[str(ROOT / "include")],
            library_dirs=[str(BUILD / "lib")],
            libraries=["weft"],
            # torch's headers as system headers: -Wextra is for our code.
            extra_compile_args=["-std=c++20", "-Wall", "-Wextra"]
            + [f"-isystem{path}" for path in include_paths()],
            extra_link_args=["-Wl,-rpath,$ORIGIN"],
        )
    ],
    cmdclass={"build_ext": Build},
)
