# train/stats: `moe stats` (expert-load report, capacity planning) and its tests.
# Included from the root CMakeLists.txt after train/config.cmake (needs moe_train_config).
add_library(moe_stats STATIC ${CMAKE_SOURCE_DIR}/train/stats.c)
target_include_directories(moe_stats PUBLIC ${CMAKE_SOURCE_DIR})
target_link_libraries(moe_stats PUBLIC moe_train_config moe_layers PkgConfig::CJSON m)
add_subdirectory(${CMAKE_SOURCE_DIR}/tests/stats ${CMAKE_BINARY_DIR}/tests/stats)
