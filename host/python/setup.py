"""The wheel holds native libraries and one optional extension (`epx/_native.abi3.so`, CPython
3.11+'s stable ABI; other Pythons use ctypes): tag it for this platform and any Python 3
(`py3-none-<platform>`), not for one CPython ABI."""

import sysconfig

from setuptools import setup
from setuptools.dist import Distribution

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70
    from wheel.bdist_wheel import bdist_wheel


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


class PlatformWheel(bdist_wheel):
    def get_tag(self):
        return "py3", "none", sysconfig.get_platform().replace("-", "_").replace(".", "_")


setup(distclass=BinaryDistribution, cmdclass={"bdist_wheel": PlatformWheel})
