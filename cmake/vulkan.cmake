# Finds what the Vulkan backend needs to build (headers and glslc; never libvulkan, which
# the backend opens at run time) and adds src/backend/vulkan when DIFFUSE_VULKAN allows.
set(DIFFUSE_VULKAN_BUILT OFF)
if(NOT DIFFUSE_VULKAN STREQUAL "OFF")
  find_path(DIFFUSE_VULKAN_INCLUDE vulkan/vulkan.h)
  find_program(DIFFUSE_GLSLC glslc)
  if(DIFFUSE_VULKAN_INCLUDE AND DIFFUSE_GLSLC)
    set(DIFFUSE_VULKAN_BUILT ON)
    add_subdirectory(src/backend/vulkan)
    message(STATUS "diffuse: Vulkan backend on (glslc ${DIFFUSE_GLSLC})")
  elseif(DIFFUSE_VULKAN STREQUAL "ON")
    message(FATAL_ERROR "DIFFUSE_VULKAN=ON but the Vulkan headers (libvulkan-dev) or glslc "
                        "were not found")
  else()
    message(STATUS "diffuse: Vulkan backend off (no Vulkan headers or glslc)")
  endif()
endif()
