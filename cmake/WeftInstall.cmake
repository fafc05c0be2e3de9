# Install rules and the package files that let other projects use an installed Weft:
# find_package(Weft) gives the imported target Weft::weft; pkg-config gives weft.
include(CMakePackageConfigHelpers)

set(WEFT_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/Weft)

# libweft.so is the only artefact users link. Its internals (weft_core, weft_common,
# weft_transport_ucx, UCX, Threads) are PRIVATE and linked into it, so the exported target
# carries nothing but the include directory and the static libraries stay out of the export.
# A UCX found outside the system directories stays reachable through the install RPATH.
set_target_properties(weft PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
install(TARGETS weft EXPORT WeftTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT Runtime NAMELINK_COMPONENT Development)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/weft
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT Development
  FILES_MATCHING PATTERN "*.h" PATTERN "*.hpp")

install(EXPORT WeftTargets NAMESPACE Weft:: FILE WeftTargets.cmake
  DESTINATION ${WEFT_CMAKE_INSTALL_DIR} COMPONENT Development)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/WeftConfig.cmake.in
  ${PROJECT_BINARY_DIR}/WeftConfig.cmake INSTALL_DESTINATION ${WEFT_CMAKE_INSTALL_DIR})
# 0.x: a minor release may break the API, so only the same major.minor is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/WeftConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/WeftConfig.cmake ${PROJECT_BINARY_DIR}/WeftConfigVersion.cmake
  DESTINATION ${WEFT_CMAKE_INSTALL_DIR} COMPONENT Development)

# weft.pc locates the prefix from its own directory, so the tree stays usable after
# `cmake --install --prefix`, DESTDIR staging or moving it.
function(weft_pc_dir out dir)
  if(IS_ABSOLUTE "${dir}")
    set(${out} "${dir}" PARENT_SCOPE)
  else()
    set(${out} "\${prefix}/${dir}" PARENT_SCOPE)
  endif()
endfunction()
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(WEFT_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  string(REGEX REPLACE "[^/]+" ".." WEFT_PC_UP "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
  set(WEFT_PC_PREFIX "\${pcfiledir}/${WEFT_PC_UP}")
endif()
weft_pc_dir(WEFT_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
weft_pc_dir(WEFT_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
configure_file(${CMAKE_CURRENT_LIST_DIR}/weft.pc.in ${PROJECT_BINARY_DIR}/weft.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/weft.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT Development)
