# Builds the dashboard (web/) into tau_server: every file under web/ becomes a byte array in a
# generated .cc, so the server ships as one file and serves the UI without reading the disk.
# Included from src/server/CMakeLists.txt after tau_server is defined.
set(TAU_WEB_DIR ${PROJECT_SOURCE_DIR}/web)
file(GLOB_RECURSE TAU_WEB_FILES CONFIGURE_DEPENDS RELATIVE ${TAU_WEB_DIR} ${TAU_WEB_DIR}/*)
# package*.json and node_modules are how the vendored files were fetched, not what is served.
list(FILTER TAU_WEB_FILES EXCLUDE REGEX "(^|/)node_modules/|^package(-lock)?\\.json$|(^|/)\\.|\\.md$")
set(TAU_WEB_DEPS "")
foreach(f IN LISTS TAU_WEB_FILES)
  list(APPEND TAU_WEB_DEPS ${TAU_WEB_DIR}/${f})
endforeach()
set(TAU_WEB_CC ${CMAKE_CURRENT_BINARY_DIR}/web_assets.cc)
add_custom_command(
  OUTPUT ${TAU_WEB_CC}
  COMMAND ${CMAKE_COMMAND} -DWEB_DIR=${TAU_WEB_DIR} "-DFILES=${TAU_WEB_FILES}" -DOUT=${TAU_WEB_CC}
          -P ${CMAKE_CURRENT_SOURCE_DIR}/web_embed.cmake
  DEPENDS ${TAU_WEB_DEPS} ${CMAKE_CURRENT_SOURCE_DIR}/web_embed.cmake
  COMMENT "Embedding the dashboard (web/)"
  VERBATIM)
target_sources(tau_server PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/web.cc ${CMAKE_CURRENT_SOURCE_DIR}/api_events.cc ${TAU_WEB_CC})
