# Cross toolchain for 64-bit Arm Linux (Jetson-class CPUs) with Debian's
# g++-aarch64-linux-gnu. Binaries run on x86 hosts through qemu-user
# (CMAKE_CROSSCOMPILING_EMULATOR), which also lets ctest and gtest_discover_tests work.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

find_program(STRATA_QEMU_AARCH64 qemu-aarch64)
if(STRATA_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${STRATA_QEMU_AARCH64} -L /usr/aarch64-linux-gnu)
endif()
