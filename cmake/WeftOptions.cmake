option(WEFT_BUILD_TESTS "Build the GoogleTest suite" ON)
option(WEFT_BUILD_BENCH "Build weft-perf and the microbenchmarks" ON)
set(WEFT_SANITIZE "" CACHE STRING "Sanitizer build: address (ASan+UBSan), thread (TSan) or empty")

# CUDA is on when a CUDA compiler is found; every host-side part builds without it.
# Sanitizer builds leave it out by default (nvcc is slow and the sanitizers do not
# instrument device code): CI compiles CUDA in its main build only.
include(CheckLanguage)
check_language(CUDA)
if(CMAKE_CUDA_COMPILER AND WEFT_SANITIZE STREQUAL "")
  option(WEFT_ENABLE_CUDA "Build the CUDA executor and transports" ON)
else()
  option(WEFT_ENABLE_CUDA "Build the CUDA executor and transports" OFF)
endif()

if(WEFT_SANITIZE STREQUAL "address")
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
elseif(WEFT_SANITIZE STREQUAL "thread")
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
elseif(NOT WEFT_SANITIZE STREQUAL "")
  message(FATAL_ERROR "WEFT_SANITIZE must be address, thread or empty")
endif()

# libFuzzer targets (tests/fuzz): AUTO builds them when the compiler links -fsanitize=fuzzer
# (clang with libFuzzer, Debian's libclang-rt-dev); ON requires it; OFF leaves them out. The
# corpus replays (plain executables) are built either way.
set(WEFT_BUILD_FUZZERS AUTO CACHE STRING "Build the libFuzzer targets: AUTO, ON or OFF")
set_property(CACHE WEFT_BUILD_FUZZERS PROPERTY STRINGS AUTO ON OFF)
set(WEFT_FUZZERS_FOUND OFF)
if(NOT WEFT_BUILD_FUZZERS STREQUAL "OFF")
  include(CheckCXXSourceCompiles)
  set(CMAKE_REQUIRED_FLAGS -fsanitize=fuzzer)
  set(CMAKE_REQUIRED_LINK_OPTIONS -fsanitize=fuzzer)
  check_cxx_source_compiles([[
#include <cstddef>
#include <cstdint>
extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }
]] WEFT_HAVE_LIBFUZZER)
  unset(CMAKE_REQUIRED_FLAGS)
  unset(CMAKE_REQUIRED_LINK_OPTIONS)
  if(WEFT_HAVE_LIBFUZZER)
    set(WEFT_FUZZERS_FOUND ON)
  elseif(WEFT_BUILD_FUZZERS STREQUAL "ON")
    message(FATAL_ERROR "WEFT_BUILD_FUZZERS=ON needs a compiler with libFuzzer (-fsanitize=fuzzer): "
                        "configure with CMAKE_CXX_COMPILER=clang++ and install clang libclang-rt-dev")
  endif()
endif()
