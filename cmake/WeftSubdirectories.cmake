# Adds every immediate subfolder of the current source folder that has a CMakeLists.txt:
# one folder per tool or benchmark family, picked up without a list to maintain.
function(weft_add_subdirectories)
  file(GLOB entries LIST_DIRECTORIES true ${CMAKE_CURRENT_SOURCE_DIR}/*)
  foreach(dir ${entries})
    if(IS_DIRECTORY ${dir} AND EXISTS ${dir}/CMakeLists.txt)
      add_subdirectory(${dir})
    endif()
  endforeach()
endfunction()
