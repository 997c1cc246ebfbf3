# config/: library moe_train_config (libconfig file -> validated struct) and its tests.
# One file per concept: config_internal.h (private) says which does what.
moe_component(moe_train_config
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/config.c ${CMAKE_CURRENT_LIST_DIR}/schema.c
          ${CMAKE_CURRENT_LIST_DIR}/suggest.c ${CMAKE_CURRENT_LIST_DIR}/message.c
          ${CMAKE_CURRENT_LIST_DIR}/scan.c ${CMAKE_CURRENT_LIST_DIR}/literal.c
          ${CMAKE_CURRENT_LIST_DIR}/read.c ${CMAKE_CURRENT_LIST_DIR}/check.c
          ${CMAKE_CURRENT_LIST_DIR}/set.c ${CMAKE_CURRENT_LIST_DIR}/write.c
          ${CMAKE_CURRENT_LIST_DIR}/init_from.c
  LINK moe_data moe_layers PkgConfig::LIBCONFIG m)

if(MOE_BUILD_TESTS)
  # One program, one ctest per case (tests/config/test_config.c lists the same names); each
  # case writes its small .cfg files into the test folder of the build tree.
  add_executable(test_config ${PROJECT_SOURCE_DIR}/tests/config/test_config.c)
  target_link_libraries(test_config PRIVATE moe_train_config)
  set(MOE_CONFIG_TEST_DIR ${PROJECT_BINARY_DIR}/tests/config)
  file(MAKE_DIRECTORY ${MOE_CONFIG_TEST_DIR})
  set(MOE_CONFIG_CASES
    defaults full int_for_float int64 set roundtrip include
    unknown_key unknown_group wrong_type out_of_range int_overflow inconsistent
    bad_enum syntax_error missing_file bad_set
    unbounded_input include_limits size_limits nul_string capacity)
  set(MOE_CONFIG_TESTS config_case_list)
  add_test(NAME config_case_list COMMAND test_config --check-list ${MOE_CONFIG_CASES})
  foreach(case ${MOE_CONFIG_CASES})
    add_test(NAME config_${case} COMMAND test_config ${case}
             WORKING_DIRECTORY ${MOE_CONFIG_TEST_DIR})
    list(APPEND MOE_CONFIG_TESTS config_${case})
  endforeach()
  set_tests_properties(${MOE_CONFIG_TESTS} PROPERTIES TIMEOUT 30)
endif()
