# The version `moe --version` prints: the project's VERSION (project(moe VERSION x.y.z) in the
# root CMakeLists.txt; 0.1.0 while it names none) and the git revision of the checkout at
# configure time (`git describe --always --dirty`; "unknown" outside a git checkout or without
# git). Configured into ${PROJECT_BINARY_DIR}/generated/train/version.h, which cli/main.c
# includes as "train/version.h". Re-run cmake to refresh the revision.
if(PROJECT_VERSION)
  set(MOE_VERSION ${PROJECT_VERSION})
else()
  set(MOE_VERSION 0.1.0)
endif()
set(MOE_GIT_REVISION unknown)
find_package(Git QUIET)
if(GIT_FOUND)
  execute_process(COMMAND ${GIT_EXECUTABLE} describe --always --dirty
                  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
                  OUTPUT_VARIABLE _moe_rev OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE _moe_rev_rc ERROR_QUIET)
  if(_moe_rev_rc EQUAL 0 AND _moe_rev)
    set(MOE_GIT_REVISION ${_moe_rev})
  endif()
endif()
configure_file(${PROJECT_SOURCE_DIR}/train/version.h.in
               ${PROJECT_BINARY_DIR}/generated/train/version.h @ONLY)
set(MOE_GENERATED_INCLUDE_DIR ${PROJECT_BINARY_DIR}/generated)
# included after the moe target is defined (root CMakeLists.txt)
target_include_directories(moe PRIVATE ${MOE_GENERATED_INCLUDE_DIR})
