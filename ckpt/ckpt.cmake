# ckpt/: library moe_ckpt (checkpoints as HF Mixtral folders: safetensors, config.json,
# trainer_state.json, save/load/resume/export; ckpt_internal.h says which file does what).
# Its tests are tests/checkpoint/.
moe_component(moe_ckpt
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/folder.c ${CMAKE_CURRENT_LIST_DIR}/weights.c
          ${CMAKE_CURRENT_LIST_DIR}/save.c ${CMAKE_CURRENT_LIST_DIR}/state.c
          ${CMAKE_CURRENT_LIST_DIR}/verify.c ${CMAKE_CURRENT_LIST_DIR}/load.c
          ${CMAKE_CURRENT_LIST_DIR}/export.c ${CMAKE_CURRENT_LIST_DIR}/hf_config.c
          ${CMAKE_CURRENT_LIST_DIR}/json_fields.c ${CMAKE_CURRENT_LIST_DIR}/safetensors.c
          ${CMAKE_CURRENT_LIST_DIR}/shards.c ${CMAKE_CURRENT_LIST_DIR}/gguf.c
          ${CMAKE_CURRENT_LIST_DIR}/gguf_export.c ${CMAKE_CURRENT_LIST_DIR}/gguf_vocab.c
  LINK moe_layers moe_optim moe_data moe_train_config PkgConfig::CJSON)
