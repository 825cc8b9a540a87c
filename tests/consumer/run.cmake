# install_consumer_test: installs BUILD_DIR into WORK_DIR/prefix, configures and
# builds this folder's project against it with find_package(flashcp), runs it
# and checks its output, and that it links no CBC (the ILP stays out of core;
# CLP, flashcp's re-cut LP, is core's).
# cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=... -DWITH_CLIENT=ON|OFF
#       -DGENERATOR=... -P run.cmake
function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
run("install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
run("configure" ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DWITH_CLIENT=${WITH_CLIENT})
run("build" ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run("run" ${WORK_DIR}/build/consumer)
set(expected "plan flashcp shards 3\nilp FAILED_PRECONDITION\n")
if(WITH_CLIENT)
  string(APPEND expected "client ok\n")
endif()
if(NOT out STREQUAL expected)
  message(FATAL_ERROR "consumer printed:\n${out}\nexpected:\n${expected}")
endif()
run("ldd" ldd ${WORK_DIR}/build/consumer)
if(out MATCHES "libCbc")
  message(FATAL_ERROR "the consumer links CBC:\n${out}")
endif()
file(REMOVE_RECURSE ${WORK_DIR})
message(STATUS "install_consumer_test: find_package(flashcp) built and ran the consumer")
