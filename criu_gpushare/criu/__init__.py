"""CRIU from Python: the tool's own dumps and restores, and facts about their images.

  rpc      dump / restore / check through `criu swrk`, with every action-script point delivered
           to a callback in this process (pycriu's own client cannot answer notifications)
  images   what an image directory holds (plugins, /dev/nvidia files, libcuda mappings, pids)
  libdir   a CRIU plugin directory without NVIDIA's cuda_plugin.so, which must not touch our tasks
  _pycriu  pycriu (shipped with CRIU, not on PyPI), imported only when one of them is called
"""
