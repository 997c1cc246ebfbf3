# stats/: `moe stats` (expert-load report, capacity planning) and its tests.
# Included from the root CMakeLists.txt after config/config.cmake (needs moe_train_config).
moe_component(moe_stats SOURCES ${CMAKE_CURRENT_LIST_DIR}/stats.c ${CMAKE_CURRENT_LIST_DIR}/watch.c
  ${CMAKE_CURRENT_LIST_DIR}/placement.c ${CMAKE_CURRENT_LIST_DIR}/records.c
  ${CMAKE_CURRENT_LIST_DIR}/quantile.c ${CMAKE_CURRENT_LIST_DIR}/run.c ${CMAKE_CURRENT_LIST_DIR}/format.c
  ${CMAKE_CURRENT_LIST_DIR}/report.c ${CMAKE_CURRENT_LIST_DIR}/capacity_plan.c
  LINK moe_train_config moe_data moe_layers moe_cli PkgConfig::CJSON m)
if(MOE_BUILD_TESTS)
  add_subdirectory(${PROJECT_SOURCE_DIR}/tests/stats ${PROJECT_BINARY_DIR}/tests/stats)
endif()
